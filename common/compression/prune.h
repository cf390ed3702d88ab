// prune.h — magnitude pruning: which weights are removed, and the mask that keeps them removed
// while a pruned model is fine-tuned (docs/compression.md, "Pruning").
//
// What is prunable: the four matrices of every block (qkv_w, attproj_w, fc_w, fcproj_w), 94% of a
// `small` model's weights. Never pruned: the tied token embedding (it is also the LM head, the
// most sensitive unit: int4 on it alone costs +0.14 nats), the position embedding, the biases
// and the layernorms (a few per mille of the weights; a layernorm weight at 0 silences a whole
// channel). Their mask bits are always 1.
//
// A pruned weight is not a parameter any more: w = keep * theta, so d loss / d theta = keep *
// d loss / d w. Fine-tuning therefore (1) masks the gradient where it is made (GPT::backward,
// before any collective: the norm, the clipping and every reduction see the pruned network's
// gradient), and (2) masks AdamW (optim.cpp, host_adamw.cpp): the update, the weight decay and the
// moments of a pruned element are left exactly as they were. Both are needed: with only (1) a
// pruned weight still moves when its moments are not 0 (a dense checkpoint resumed with a mask)
// and decays when it is not 0; with only (2) the gradient norm and so the clipping count weights
// that do not exist.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layout.h"

namespace nz {

// Whether a tensor is pruned by `prune` (see above).
bool prunable(const TensorSpec& t);

enum class PruneScope { PerMatrix, Global };

// Magnitude pruning of a model (params: Ψ floats in the model file's order). Per matrix: each
// prunable matrix loses floor(S * its size) weights, its smallest |w|; global: floor(S * M) of the
// M prunable weights, the smallest |w| over all of them together. Ties go to the lower index
// (a stable order), so the mask is a function of the weights alone. Returns keep[i] (Ψ bytes, 1 =
// kept); the pruned weights of params are set to 0.
std::vector<uint8_t> magnitude_prune(const GPTConfig& cfg, std::vector<float>* params, double sparsity,
                                     PruneScope scope);
// The number of prunable weights of a model.
size_t prunable_count(const GPTConfig& cfg);

// The mask in a trainer's layout: keep[u][k] for element k of unit u (padded; padding kept: it is 0
// and has no gradient). AdamWConfig and GPT hold it (shared, read-only).
struct UnitMasks {
  std::vector<std::vector<uint8_t>> keep;
  size_t pruned = 0;  // elements with keep 0
  // element `at` of unit u's slice starting at `begin` is pruned
  bool pruned_at(int u, size_t begin, size_t at) const { return !keep[u][begin + at]; }
};
// keep (Ψ bytes, model file order) spread over layout L's units.
std::shared_ptr<const UnitMasks> unit_masks(const Layout& L, const std::vector<uint8_t>& keep);

// Elements [0, n) of unit u's slice starting at `begin`, pruned ones set to 0 (storage type of
// elem_bytes bytes per element; host memory).
void zero_pruned(const UnitMasks& m, int u, size_t begin, size_t n, void* x, size_t elem_bytes);

}  // namespace nz
