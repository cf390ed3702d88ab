// rng.h — a small deterministic random generator (splitmix64 + Box-Muller): the same numbers on
// every machine, rank and stage, for initialisation, data sampling and text generation.
#pragma once
#include <cmath>
#include <cstdint>

namespace nz {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream = 0) : state_(splitmix64(seed) ^ splitmix64(stream * 0x5851f42d4c957f2dull + 1)) {}
  uint64_t next() { return splitmix64(state_++); }
  // uniform in [0, 1), 24 random bits
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  // standard normal (Box-Muller, one of the pair)
  float normal() {
    double u1 = (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = double(next() >> 11) * (1.0 / 9007199254740992.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

}  // namespace nz
