// test_model.cpp — the whole model's gradient against central finite differences in double
// precision on `tiny`, the layout against the textbook parameter count, and the data loader's
// promise that N ranks with batch B see exactly what 1 rank with batch N*B sees.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "input/data.h"
#include "ledger.h"
#include "model.h"
#include "runtime/rng.h"

using namespace nz;

TEST(Layout, CountsTheTextbookParameterNumber) {
  for (const char* name : {"tiny", "small", "gpt2"}) {
    GPTConfig c;
    ASSERT_TRUE(preset_config(name, &c));
    for (int N : {1, 2, 3, 4, 7}) {
      Layout L = make_layout(c, N);
      EXPECT_EQ(L.num_params, param_count_formula(c)) << name;
      size_t padded = 0, shard = 0;
      for (const Unit& u : L.units) {
        EXPECT_EQ(u.padded % N, 0u);
        EXPECT_LT(u.padded - u.numel, size_t(N));  // padding is less than one element per rank
        EXPECT_EQ(u.offset, padded);
        EXPECT_EQ(u.shard_offset, shard);
        padded += u.padded;
        shard += u.padded / N;
      }
      EXPECT_EQ(L.padded_total, padded);
      EXPECT_EQ(L.shard_total * N, L.padded_total);
      EXPECT_EQ(L.num_units(), c.layers + 2);
    }
  }
  GPTConfig small;
  preset_config("small", &small);
  EXPECT_NEAR(double(param_count_formula(small)), 1.0e6, 0.1e6);  // "about a million"
}

namespace {
// Mean loss of the model in double for the given parameters (full, padded, N = 1).
double model_loss(GPT& m, const Layout& L, const std::vector<double>& p) {
  for (int u = 0; u < L.num_units(); u++) m.forward(u, p.data() + L.units[u].offset);
  m.head_forward(p.data());
  return m.take_loss_sum() / double(m.batch() * m.seq());
}
}  // namespace

TEST(Model, WholeModelGradientMatchesFiniteDifferencesInDouble) {
  Ledger::get().reset();
  GPTConfig c{256, 8, 2, 12, 3};  // 2 blocks, width 12, 3 heads, context 8
  Layout L = make_layout(c, 1);
  const int B = 2, T = 6;
  GPT m(L, DType::F64, B, T);
  std::vector<double> p(L.padded_total);
  std::vector<float> unit;
  for (int u = 0; u < L.num_units(); u++) {
    unit.resize(L.units[u].padded);
    init_unit(L, u, 7, unit.data());
    for (size_t i = 0; i < unit.size(); i++) p[L.units[u].offset + i] = unit[i];
  }
  // make layernorm and biases non-trivial so their gradients are tested in general position
  Rng rng(3);
  for (size_t i = 0; i < p.size(); i++) p[i] += 0.05 * rng.normal();
  for (int u = 0; u < L.num_units(); u++)
    for (size_t i = L.units[u].numel; i < L.units[u].padded; i++) p[L.units[u].offset + i] = 0;
  std::vector<int> tok(B * T), tgt(B * T);
  for (int i = 0; i < B * T; i++) tok[i] = int(rng.next() % 256), tgt[i] = int(rng.next() % 256);
  m.set_batch(tok.data(), tgt.data(), B);

  // analytic gradient, unit by unit, in the order a trainer runs them
  std::vector<double> g(L.padded_total);
  model_loss(m, L, p);
  m.head_backward(p.data());
  for (int u = L.num_units() - 1; u >= 0; u--)
    m.backward(u, p.data() + L.units[u].offset, g.data() + L.units[u].offset);

  // finite differences on a sample of every tensor of every unit
  double worst = 0;
  const double h = 3e-5;
  for (int u = 0; u < L.num_units(); u++) {
    for (const TensorSpec& t : L.units[u].tensors) {
      for (int s = 0; s < 4; s++) {
        size_t i = L.units[u].offset + t.offset + (rng.next() % t.numel);
        if (t.name == "wte") i = L.units[u].offset + size_t(tok[s]) * c.dim + s;  // rows that are used
        double keep = p[i];
        p[i] = keep + h;
        double lp = model_loss(m, L, p);
        p[i] = keep - h;
        double lm = model_loss(m, L, p);
        p[i] = keep;
        double fd = (lp - lm) / (2 * h);
        // relative error, with a floor so round-off on a near-zero gradient is not "relative"
        double err = std::fabs(fd - g[i]) / std::max(1e-4, std::fabs(fd) + std::fabs(g[i]));
        worst = std::max(worst, err);
        EXPECT_LT(err, 1e-6) << L.units[u].name << "." << t.name << " fd " << fd << " analytic " << g[i];
      }
    }
  }
  printf("whole-model gradient: worst relative error vs finite differences %.2e\n", worst);
  // padding never receives gradient
  for (int u = 0; u < L.num_units(); u++)
    for (size_t i = L.units[u].numel; i < L.units[u].padded; i++) EXPECT_EQ(g[L.units[u].offset + i], 0.0);
}

TEST(Model, InitIsIdenticalWhateverTheWorldSize) {
  GPTConfig c;
  preset_config("tiny", &c);
  Layout L1 = make_layout(c, 1), L3 = make_layout(c, 3);
  for (int u = 0; u < L1.num_units(); u++) {
    std::vector<float> a(L1.units[u].padded), b(L3.units[u].padded);
    init_unit(L1, u, 42, a.data());
    init_unit(L3, u, 42, b.data());
    for (size_t i = 0; i < L1.units[u].numel; i++) ASSERT_EQ(a[i], b[i]);
  }
}

TEST(Data, NRanksWithBatchBSeeWhatOneRankWithBatchNBSees) {
  const char* path = "data/corpus.txt";
  const int T = 16, B = 2, N = 3, K = 2;
  DataLoader one(path, N * B, T, 5), each(path, B, T, 5);
  std::vector<int> t1(N * B * T), y1(N * B * T), tr(B * T), yr(B * T);
  for (int step = 0; step < 3; step++)
    for (int k = 0; k < K; k++) {
      one.train_batch(step, k, K, 1, 0, t1.data(), y1.data());
      for (int r = 0; r < N; r++) {
        each.train_batch(step, k, K, N, r, tr.data(), yr.data());
        for (int i = 0; i < B * T; i++) {
          ASSERT_EQ(tr[i], t1[r * B * T + i]);
          ASSERT_EQ(yr[i], y1[r * B * T + i]);
        }
      }
    }
  // accum K with batch B sees what accum 1 with batch K*B sees
  DataLoader big(path, K * B, T, 5);
  std::vector<int> tb(K * B * T), yb(K * B * T);
  big.train_batch(1, 0, 1, 1, 0, tb.data(), yb.data());
  for (int k = 0; k < K; k++) {
    each.train_batch(1, k, K, 1, 0, tr.data(), yr.data());
    for (int i = 0; i < B * T; i++) ASSERT_EQ(tr[i], tb[k * B * T + i]);
  }
  // targets are the next byte
  for (int i = 0; i + 1 < T; i++) EXPECT_EQ(tr[i + 1], yr[i]);
}
