// prune.cpp — magnitude pruning and the mask in a trainer's layout (prune.h).
#include "compression/prune.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "runtime/check.h"

namespace nz {

bool prunable(const TensorSpec& t) {
  return t.name == "qkv_w" || t.name == "attproj_w" || t.name == "fc_w" || t.name == "fcproj_w";
}

// Every prunable matrix as (first element in the model file, length), in file order.
static std::vector<std::pair<size_t, size_t>> prunable_ranges(const GPTConfig& cfg) {
  const Layout L = make_layout(cfg, 1);  // one rank: no padding, units back to back as in the file
  std::vector<std::pair<size_t, size_t>> r;
  for (const Unit& u : L.units)
    for (const TensorSpec& t : u.tensors)
      if (prunable(t)) r.push_back({u.offset + t.offset, t.numel});
  return r;
}

size_t prunable_count(const GPTConfig& cfg) {
  size_t n = 0;
  for (auto [at, len] : prunable_ranges(cfg)) n += len;
  return n;
}

// Prunes the `count` smallest |w| among the given elements (ties: the lower index first).
static void prune_smallest(std::vector<size_t> idx, size_t count, std::vector<float>* w, std::vector<uint8_t>* keep) {
  const float* p = w->data();
  auto smaller = [p](size_t a, size_t b) {
    const float fa = std::fabs(p[a]), fb = std::fabs(p[b]);
    return fa < fb || (fa == fb && a < b);
  };
  if (count == 0) return;
  std::nth_element(idx.begin(), idx.begin() + (count - 1), idx.end(), smaller);
  for (size_t i = 0; i < count; i++) (*keep)[idx[i]] = 0, (*w)[idx[i]] = 0.0f;
}

std::vector<uint8_t> magnitude_prune(const GPTConfig& cfg, std::vector<float>* params, double sparsity,
                                     PruneScope scope) {
  NZ_CHECK(params->size() == param_count_formula(cfg), "magnitude_prune: %zu parameters for a model of %zu",
           params->size(), param_count_formula(cfg));
  NZ_CHECK(sparsity >= 0 && sparsity < 1, "magnitude_prune: sparsity %g", sparsity);
  std::vector<uint8_t> keep(params->size(), 1);
  const auto ranges = prunable_ranges(cfg);
  auto indices = [](size_t at, size_t len, std::vector<size_t>* idx) {
    for (size_t i = 0; i < len; i++) idx->push_back(at + i);
  };
  if (scope == PruneScope::PerMatrix) {
    for (auto [at, len] : ranges) {
      std::vector<size_t> idx;
      indices(at, len, &idx);
      prune_smallest(std::move(idx), size_t(std::floor(sparsity * double(len))), params, &keep);
    }
  } else {
    std::vector<size_t> idx;
    for (auto [at, len] : ranges) indices(at, len, &idx);
    const size_t count = size_t(std::floor(sparsity * double(idx.size())));
    prune_smallest(std::move(idx), count, params, &keep);
  }
  return keep;
}

std::shared_ptr<const UnitMasks> unit_masks(const Layout& L, const std::vector<uint8_t>& keep) {
  NZ_CHECK(keep.size() == L.num_params, "unit_masks: a mask of %zu for %zu parameters", keep.size(), L.num_params);
  auto m = std::make_shared<UnitMasks>();
  size_t at = 0;  // in the file's order: the units back to back, unpadded
  for (const Unit& u : L.units) {
    std::vector<uint8_t> k(u.padded, 1);
    std::copy(keep.begin() + at, keep.begin() + at + u.numel, k.begin());
    at += u.numel;
    m->pruned += size_t(std::count(k.begin(), k.end(), 0));
    m->keep.push_back(std::move(k));
  }
  return m;
}

void zero_pruned(const UnitMasks& m, int u, size_t begin, size_t n, void* x, size_t elem_bytes) {
  char* p = static_cast<char*>(x);
  for (size_t i = 0; i < n; i++)
    if (m.pruned_at(u, begin, i)) memset(p + i * elem_bytes, 0, elem_bytes);
}

}  // namespace nz
