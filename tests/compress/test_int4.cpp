// test_int4.cpp — int4 weights for inference (inference/quant.h, generate and gpt_eval
// --weights-int4):
//   - gpt_eval's int4 model is the block rule written out here, element by element (blocks from
//     each unit's first element, scale = absmax / 7 in fp32, codes round-half-even clamped to
//     -7..7, a zero block all zeros, a unit's last block shorter), the embedding untouched when kept;
//   - generate --weights-int4 computes with exactly those weights: its greedy text equals plain
//     generate's on a model file holding them (device and host placements, reference kernels).
// The bytes each format stores and moves, the same text on every placement and the bad input:
// tests/compress/int4_check.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "harness.h"
#include "inference/quant.h"
#include "io/model_file.h"
#include "layout.h"
#include "model.h"  // init_unit
#include "runtime/rng.h"

using namespace nz;

namespace {

// The tiny model, randomly initialised, with noise on the layernorms and biases, one block of
// zeros and one very large weight (a block whose scale is set by one outlier).
std::vector<float> tiny_params(const Layout& L) {
  std::vector<float> p(L.padded_total);
  for (int u = 0; u < L.num_units(); u++) init_unit(L, u, 7, p.data() + L.units[u].offset);
  Rng rng(5);
  for (float& x : p) x += 0.01f * float(rng.normal());
  const size_t block1 = L.units[1].offset;
  for (size_t i = 0; i < 64; i++) p[block1 + 256 + i] = 0.0f;
  p[block1 + 1000] = 40.0f;
  return p;
}

// The rule, written here (docs/compression.md, "int4 weights"; kernels/quantize.h).
std::vector<float> int4_by_hand(const Layout& L, std::vector<float> p, bool keep_embed, size_t B) {
  for (int u = 0; u < L.num_units(); u++) {
    if (keep_embed && u == L.embed_unit()) continue;
    float* w = p.data() + L.units[u].offset;
    const size_t n = L.units[u].padded;
    for (size_t b0 = 0; b0 < n; b0 += B) {
      const size_t b1 = std::min(n, b0 + B);
      float absmax = 0;
      for (size_t i = b0; i < b1; i++) absmax = std::max(absmax, std::fabs(w[i]));
      const float scale = absmax / 7.0f;
      for (size_t i = b0; i < b1; i++) {
        // the code is an integer: -0.3 rounds to the code 0, which dequantises to +0.0
        const int q = scale == 0 ? 0 : int(std::min(7.0f, std::max(-7.0f, std::nearbyint(w[i] / scale))));
        w[i] = float(q) * scale;
      }
    }
  }
  return p;
}

}  // namespace

TEST(Int4, GptEvalsModelIsTheBlockRule) {
  GPTConfig c;
  ASSERT_TRUE(preset_config("tiny", &c));
  const Layout L = make_layout(c, 1);
  const std::vector<float> p = tiny_params(L);
  for (size_t B : {size_t(8), size_t(32), size_t(4096)}) {  // 4096 divides no unit of tiny
    for (bool keep : {true, false}) {
      SCOPED_TRACE("B=" + std::to_string(B) + (keep ? " embedding kept" : " embedding int4"));
      std::vector<float> got = p;
      int4_roundtrip(L, &got, keep, B);
      const std::vector<float> want = int4_by_hand(L, p, keep, B);
      size_t differ = 0, changed = 0;
      for (size_t i = 0; i < p.size(); i++) {
        if (memcmp(&got[i], &want[i], 4) != 0 && differ++ < 3)
          ADD_FAILURE() << "element " << i << ": " << p[i] << " -> " << got[i] << ", by hand " << want[i];
        changed += got[i] != p[i];
      }
      EXPECT_EQ(differ, 0u);
      EXPECT_GT(changed, p.size() / 2);  // it did quantise
    }
  }
}

TEST(Int4, GenerateComputesWithGptEvalsWeights) {
  // a briefly trained tiny model (a random one's text hardly depends on its weights)
  const nzt::RunResult& trained = nzt::run_cached(
      "stage0_ddp", 1, "--preset tiny --seq 32 --batch 4 --steps 30 --eval-every 0 --eval-windows 2", "int4");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  GPTConfig c;
  std::vector<float> p;
  load_model(trained.model_path, &c, &p);
  const Layout L = make_layout(c, 1);  // one rank: padded = numel, the file's order
  const std::string dense = trained.model_path, quantised = nzt::temp_dir() + "/int4_roundtrip.model";
  int4_roundtrip(L, &p, true, 64);  // generate's default block
  std::string why;
  ASSERT_TRUE(write_model_file(quantised, c, p, &why)) << why;
  const std::string gen = nzt::program_path("generate") +
                          " --prompt Once --length 48 --temperature 0.8 --kernels reference --quiet --model ";
  std::string want, got;
  ASSERT_EQ(nzt::run_command(gen + quantised, &want), 0) << want;
  for (const char* w : {"device", "host"}) {
    ASSERT_EQ(nzt::run_command(gen + dense + " --weights-int4 --weights " + w, &got), 0) << got;
    EXPECT_EQ(got, want) << w;
  }
  ASSERT_EQ(nzt::run_command(gen + dense, &got), 0) << got;
  EXPECT_NE(got, want) << "int4 changed nothing: the comparison could not fail";
}
