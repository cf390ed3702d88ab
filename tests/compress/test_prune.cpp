// test_prune.cpp — pruning (compression/prune.h, pruned_file.h, tools/prune.cpp) and fine-tuning a pruned
// model in every stage of the ladder, as a learner runs them:
//   - the pruned file: its size is the formula written out below, its mask prunes exactly
//     floor(S n) of each matrix (or of all of them, --scope global), the smallest |w| (ties to the
//     lower index), and nothing else; its kept values are the model's, bit for bit;
//   - every stage with --prune-mask: every pruned weight is exactly 0.0 (its bits) in the saved
//     model after several steps, while the stages' equality contract still holds (contract.h's
//     check: N = 2 at accum 1, all five bit for bit; N = 3 at accum 2, bit for bit within each
//     group and the derived cross-group bound between them);
//   - a dense checkpoint resumed with the mask (pruned weights with nonzero Adam moments): the
//     pruned weights are 0.0 in every stage and the five agree bit for bit;
//   - a fine-tuning checkpoint resumes bit for bit (stage3 and offload, 2 ranks);
//   - the gradient is the pruned network's: step 1's gradient norm is the norm of the dense
//     gradient restricted to the kept weights, computed here with the model's own kernels on the
//     same batch, and the mask applied by this test;
//   - the broken copies of tests/compress/prune_mutants.mk are caught.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "kernels/kernels.h"  // set_kernels: the reference kernels, as the run below uses
#include "layout.h"
#include "model.h"
#include "input/cli.h"   // default_data_path
#include "input/data.h"

using namespace nzt;

namespace {

const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 1 --clip 0.5 --eval-every 0 --eval-windows 2 ";
const double kSparsity = 0.5;

// The pruned file, read here from its description in docs/files.md ("Pruned model file"),
// independently of io/pruned_file.cpp.
struct PrunedFile {
  uint64_t size = 0, params = 0, kept = 0;
  std::vector<uint8_t> keep;    // per parameter
  std::vector<float> weights;  // dense: the kept values in place, 0 elsewhere
};
PrunedFile read_pruned(const std::string& path) {
  const std::string raw = read_file(path);
  PrunedFile f;
  f.size = raw.size();
  if (raw.size() < 48 || raw.compare(0, 8, "NZGPTPRN") != 0) return f;
  memcpy(&f.params, raw.data() + 32, 8);
  memcpy(&f.kept, raw.data() + 40, 8);
  const uint64_t mask_bytes = (f.params + 7) / 8;
  if (raw.size() < 48 + mask_bytes + 4 * f.kept) return f;
  const char* values = raw.data() + 48 + mask_bytes;
  uint64_t j = 0;
  for (uint64_t i = 0; i < f.params; i++) {
    const bool kept = (uint8_t(raw[48 + i / 8]) >> (i % 8)) & 1;
    f.keep.push_back(kept);
    float w = 0;
    if (kept && j < f.kept) memcpy(&w, values + 4 * j++, 4);
    f.weights.push_back(w);
  }
  return f;
}

// The tiny preset's prunable matrices in the model file's order (model.h's shapes: C = 32, 2
// blocks; each block ln1_w, ln1_b (C), qkv_w (3C x C), qkv_b (3C), attproj_w (C x C), attproj_b,
// ln2_w, ln2_b, fc_w (4C x C), fc_b (4C), fcproj_w (C x 4C), fcproj_b), after wte (256 x C) and wpe
// (32 x C): (first element, length).
std::vector<std::pair<size_t, size_t>> tiny_matrices() {
  const size_t C = 32, V = 256, ctx = 32;
  const size_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  std::vector<std::pair<size_t, size_t>> m;
  for (size_t b = 0; b < 2; b++) {
    size_t at = V * C + ctx * C + b * block + 2 * C;
    m.push_back({at, 3 * C * C});
    at += 3 * C * C + 3 * C;
    m.push_back({at, C * C});
    at += C * C + C + 2 * C;
    m.push_back({at, 4 * C * C});
    at += 4 * C * C + 4 * C;
    m.push_back({at, 4 * C * C});
  }
  return m;
}

// Run once per process: a dense model trained 3 steps on one rank, its checkpoint (the moments
// are then nonzero everywhere), and the model pruned at 0.5 per matrix and globally.
struct Fixture {
  std::string dense_model, ckpt, per_matrix, global;
  std::string problem;
};
const Fixture& fixture() {
  static Fixture s = [] {
    Fixture s;
    s.ckpt = fresh_dir("dense_ckpt");
    const RunResult& d = run_cached("stage0_ddp", 1, kTiny + "--steps 3 --ckpt-dir " + s.ckpt, "dense");
    if (d.exit_code != 0) {
      s.problem = "the dense run failed: " + d.output;
      return s;
    }
    s.dense_model = d.model_path;
    s.per_matrix = temp_dir() + "/pruned_matrix.nzp";
    s.global = temp_dir() + "/pruned_global.nzp";
    std::string out;
    for (auto [path, scope] : {std::pair{s.per_matrix, "per-matrix"}, std::pair{s.global, "global"}}) {
      const std::string cmd = program_path("prune") + " --model " + s.dense_model + " --out " + path +
                              " --sparsity " + std::to_string(kSparsity) + " --scope " + scope;
      if (run_command(cmd, &out) != 0) s.problem += "prune failed: " + out;
    }
    return s;
  }();
  return s;
}

// The saved model's parameters at the pruned positions that are not exactly +0.0.
size_t pruned_nonzero(const std::string& model, const PrunedFile& mask) {
  const std::vector<float> p = model_params(model);
  if (p.size() != mask.keep.size()) return SIZE_MAX;
  size_t bad = 0;
  for (size_t i = 0; i < p.size(); i++) {
    uint32_t bits;
    memcpy(&bits, &p[i], 4);
    bad += !mask.keep[i] && bits != 0;
  }
  return bad;
}

const char* kLadder[] = {"stage0_ddp", "stage1", "stage2", "stage3", "offload"};

}  // namespace

TEST(PrunedFile, SizeIsTheFormulaAndTheMaskIsMagnitude) {
  const Fixture& s = fixture();
  ASSERT_EQ(s.problem, "");
  const std::vector<float> dense = model_params(s.dense_model);
  const auto matrices = tiny_matrices();
  for (bool global : {false, true}) {
    SCOPED_TRACE(global ? "global" : "per matrix");
    const PrunedFile f = read_pruned(global ? s.global : s.per_matrix);
    ASSERT_EQ(f.params, dense.size());
    ASSERT_EQ(f.keep.size(), dense.size());
    // what is pruned: floor(S n) of each matrix, or floor(S M) of the M matrix weights together
    size_t M = 0, pruned_in_matrices = 0;
    std::vector<uint8_t> in_matrix(dense.size(), 0);
    for (auto [at, n] : matrices) {
      size_t pruned = 0;
      for (size_t i = at; i < at + n; i++) {
        pruned += !f.keep[i];
        in_matrix[i] = 1;
      }
      if (!global) {
        EXPECT_EQ(pruned, size_t(std::floor(kSparsity * double(n)))) << "matrix at " << at;
      }
      M += n;
      pruned_in_matrices += pruned;
    }
    EXPECT_EQ(pruned_in_matrices, size_t(std::floor(kSparsity * double(M))));
    uint64_t kept = 0;
    for (size_t i = 0; i < dense.size(); i++) {
      kept += f.keep[i];
      ASSERT_TRUE(in_matrix[i] || f.keep[i]) << "parameter " << i << " is not in a block's matrix";
      ASSERT_TRUE(!f.keep[i] || memcmp(&f.weights[i], &dense[i], 4) == 0) << "kept value " << i;
    }
    EXPECT_EQ(kept, f.kept);
    // the smallest |w|: every pruned one <= every kept one, per matrix or over all of them
    auto check_order = [&](const std::vector<std::pair<size_t, size_t>>& group) {
      float max_pruned = 0, min_kept = INFINITY;
      for (auto [at, n] : group) {
        for (size_t i = at; i < at + n; i++) {
          if (f.keep[i]) min_kept = std::min(min_kept, std::fabs(dense[i]));
          else max_pruned = std::max(max_pruned, std::fabs(dense[i]));
        }
      }
      EXPECT_LE(max_pruned, min_kept);
    };
    if (global) {
      check_order(matrices);
    } else {
      for (auto m : matrices) check_order({m});
    }
    // the size: header 48 (magic 8, version 4, shape 5 x 4, Ψ 8, kept 8), mask ceil(Ψ/8), 4 per
    // kept value, CRC 4
    EXPECT_EQ(f.size, 48 + (f.params + 7) / 8 + 4 * f.kept + 4);
    printf("%s: %llu bytes for %llu parameters, %llu kept (model file: %llu bytes)\n", global ? "global" : "per-matrix",
           (unsigned long long)f.size, (unsigned long long)f.params, (unsigned long long)f.kept,
           (unsigned long long)(40 + 4 * f.params + 4));
  }
}

// Every rung fine-tunes the pruned model: the pruned weights stay exactly 0, and the contract holds.
TEST(PruneMask, EveryStageKeepsPrunedWeightsAtZeroBitForBit) {
  const Fixture& s = fixture();
  ASSERT_EQ(s.problem, "");
  const PrunedFile mask = read_pruned(s.per_matrix);
  const std::string flags = kTiny + "--steps 4 --prune-mask " + s.per_matrix + " ";
  for (auto [N, K] : {std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
    const std::string f = flags + "--accum " + std::to_string(K);
    const RunResult& ddp = run_cached("stage0_ddp", N, f, "prune");
    ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
    EXPECT_NE(ddp.output.find("pruned: "), std::string::npos) << ddp.output;
    // the contract (harness.h, contract_problems): bit for bit stage0_ddp at accum 1, and at
    // accum 2 the trainer's own group, and step 1's norm within the derived cross-group bound
    // (the micro-batch norms of the pruned model: a one-rank run at learning rate 0, with the mask)
    const std::vector<double> micro = K > 1 ? micro_batch_norms(f, N, K, "prune") : std::vector<double>{};
    for (const char* st : kLadder) {
      const RunResult& r = run_cached(st, N, f, "prune");
      ASSERT_EQ(r.exit_code, 0) << st << ": " << r.output;
      EXPECT_EQ(pruned_nonzero(r.model_path, mask), 0u) << st << ": pruned weights that are not 0.0";
      const std::string peer = std::string(st) == "stage3" ? "stage2" : "stage3";
      std::string summary;
      for (const std::string& problem : contract_problems(st, r, N, K, "fp32", ddp, peer,
                                                          &run_cached(peer, N, f, "prune"), &micro, &summary))
        ADD_FAILURE() << st << ": " << problem;
      printf("%s N=%d accum=%d: pruned weights 0.0; %s\n", st, N, K, summary.c_str());
    }
    // it trained: most kept weights moved from the pruned file's
    const std::vector<float> p = model_params(ddp.model_path);
    size_t moved = 0;
    for (size_t i = 0; i < p.size(); i++) moved += mask.keep[i] && p[i] != mask.weights[i];
    EXPECT_GT(moved, p.size() / 2);
  }
  // bf16: the fp32 master is masked too
  const std::string f = flags + "--precision bf16";
  const RunResult& ddp = run_cached("stage0_ddp", 2, f, "prune_bf16");
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  for (const char* st : {"stage0_ddp", "stage3"}) {
    const RunResult& r = run_cached(st, 2, f, "prune_bf16");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(pruned_nonzero(r.model_path, mask), 0u) << st << " bf16";
    EXPECT_TRUE(compare_runs(ddp, r).identical()) << st << " bf16: " << compare_runs(ddp, r).str();
  }
}

// A dense checkpoint resumed with the mask: the pruned weights have nonzero moments, so AdamW
// must leave them alone itself (the gradient mask alone would not keep them at 0).
TEST(PruneMask, DenseCheckpointResumedWithTheMask) {
  const Fixture& s = fixture();
  ASSERT_EQ(s.problem, "");
  const PrunedFile mask = read_pruned(s.per_matrix);
  const std::string flags = kTiny + "--steps 6 --resume " + s.ckpt + " --prune-mask " + s.per_matrix;
  const RunResult& ddp = run_cached("stage0_ddp", 2, flags, "prune_resume");
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  for (const char* st : kLadder) {
    const RunResult& r = run_cached(st, 2, flags, "prune_resume");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(pruned_nonzero(r.model_path, mask), 0u) << st;
    EXPECT_TRUE(compare_runs(ddp, r).identical()) << st << ": " << compare_runs(ddp, r).str();
  }
}

// A checkpoint of a pruned fine-tuning resumes bit for bit.
TEST(PruneMask, CheckpointsResumeBitForBit) {
  const Fixture& s = fixture();
  ASSERT_EQ(s.problem, "");
  const std::string flags = kTiny + "--prune-mask " + s.per_matrix + " ";
  for (const char* st : {"stage3", "offload"}) {
    const std::string dir = fresh_dir(std::string("prune_ckpt_") + st);
    const RunResult& whole = run_cached(st, 2, flags + "--steps 6 --ckpt-every 3 --ckpt-dir " + dir, "prune_whole");
    const RunResult& rest = run_cached(st, 2, flags + "--steps 6 --resume " + dir + "/step-00000003", "prune_rest");
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    ASSERT_EQ(rest.exit_code, 0) << rest.output;
    EXPECT_TRUE(same_model_bits(whole.model_path, rest.model_path)) << st;
    std::vector<double> a = step_values(whole.report, "loss"), b = step_values(rest.report, "loss");
    ASSERT_EQ(a.size(), 6u);
    EXPECT_EQ(std::vector<double>(a.begin() + 3, a.end()), b) << st;
  }
}

// Step 1's gradient norm against the pruned network's, computed here: the dense gradient of the
// pruned file's weights on the run's first batch (the model's reference kernels, one rank), with
// the mask applied by this test, summed in the trainer's order (unit by unit, element by element).
double masked_norm_here(const PrunedFile& f) {
  nz::GPTConfig c;
  nz::preset_config("tiny", &c);
  const nz::Layout L = nz::make_layout(c, 1);
  nz::set_kernels(nz::Kernels::Reference);
  const int B = 2, T = 32;
  nz::GPT model(L, nz::DType::F32, B, T);
  nz::DataLoader data(nz::default_data_path(), B, T, 1337);
  std::vector<int> tok(B * T), tgt(B * T);
  data.train_batch(0, 0, 1, 1, 0, tok.data(), tgt.data());
  model.set_batch(tok.data(), tgt.data(), B);
  std::vector<float> p(L.padded_total, 0.0f), g(L.padded_total, 0.0f);
  std::copy(f.weights.begin(), f.weights.end(), p.begin());  // one rank: no padding
  for (int u = 0; u < L.num_units(); u++) model.forward(u, p.data() + L.units[u].offset);
  model.head_forward(p.data());
  model.head_backward(p.data());
  for (int u = L.num_units() - 1; u >= 0; u--)
    model.backward(u, p.data() + L.units[u].offset, g.data() + L.units[u].offset);
  double sq = 0;
  for (int u = 0; u < L.num_units(); u++) {
    double unit = 0;
    for (size_t i = L.units[u].offset; i < L.units[u].offset + L.units[u].numel; i++)
      unit += f.keep[i] ? double(g[i]) * double(g[i]) : 0.0;
    sq += unit;
  }
  return std::sqrt(sq);
}

TEST(PruneMask, GradientIsThePrunedNetworks) {
  const Fixture& s = fixture();
  ASSERT_EQ(s.problem, "");
  const double want = masked_norm_here(read_pruned(s.per_matrix));
  const RunResult& r = run_cached("stage0_ddp", 1,
                                  kTiny + "--steps 1 --kernels reference --prune-mask " + s.per_matrix, "prune_grad");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double got = step_values(r.report, "grad_norm").at(0);
  printf("step 1 grad norm %.17g, the pruned network's (computed here) %.17g\n", got, want);
  EXPECT_EQ(got, want);
}

// The broken copies: each must fail the check that names its bug.
TEST(PruneMask, BrokenCopiesAreCaught) {
  const Fixture& s = fixture();
  ASSERT_EQ(s.problem, "");
  const PrunedFile mask = read_pruned(s.per_matrix);
  // grad_unmasked: the weights stay 0, but step 1's norm is the dense network's
  {
    const RunResult& r = run_cached("mutant_prune_grad_unmasked", 1,
                                    kTiny + "--steps 1 --kernels reference --prune-mask " + s.per_matrix, "mutant");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(step_values(r.report, "grad_norm").at(0), masked_norm_here(mask)) << "grad_unmasked not caught";
  }
  // decay_unmasked (stage3), host_unmasked (offload): a resumed dense checkpoint's pruned weights move
  const std::string resume = kTiny + "--steps 6 --resume " + s.ckpt + " --prune-mask " + s.per_matrix;
  for (const char* m : {"mutant_prune_decay_unmasked", "mutant_prune_host_unmasked"}) {
    const RunResult& r = run_cached(m, 2, resume, "mutant");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const size_t bad = pruned_nonzero(r.model_path, mask);
    EXPECT_GT(bad, 0u) << m << " not caught";
    printf("%s: %zu pruned weights off 0.0 (caught)\n", m, bad);
  }
  // one_shard (stage2, 2 ranks): rank 1 freezes the wrong elements: not stage0_ddp's bits
  {
    const std::string f = kTiny + "--steps 4 --prune-mask " + s.per_matrix + " --accum 1";
    const RunResult& ddp = run_cached("stage0_ddp", 2, f, "prune");
    const RunResult& r = run_cached("mutant_prune_one_shard", 2, f, "mutant");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Verdict v = compare_runs(ddp, r);
    EXPECT_FALSE(v.identical()) << "one_shard not caught";
    printf("mutant_prune_one_shard: %s (caught)\n", v.str().c_str());
  }
}
