// sampling.h — the next byte from a row of probabilities (gpt_sample, inference/generate).
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/rng.h"

namespace nz {

// A sample from p^(1/temperature), renormalised. Computed as exp((log p - log p_max) / temperature)
// in double, so the most likely byte weighs 1 and nothing underflows to an all-zero row: as the
// temperature goes to 0 this becomes the argmax (greedy), which temperature 0 is exactly.
inline int sample_byte(const float* probs, int V, float temperature, Rng& rng) {
  int best = 0;
  for (int v = 1; v < V; v++)
    if (probs[v] > probs[best]) best = v;
  if (temperature <= 0) return best;
  std::vector<double> w(V);
  const double log_max = std::log(std::max<double>(probs[best], 1e-300));
  double total = 0;
  for (int v = 0; v < V; v++)
    total += (w[v] = std::exp((std::log(std::max<double>(probs[v], 1e-300)) - log_max) / temperature));
  double r = rng.uniform() * total, acc = 0;
  for (int v = 0; v < V; v++)
    if ((acc += w[v]) >= r && w[v] > 0) return v;
  return best;
}

}  // namespace nz
