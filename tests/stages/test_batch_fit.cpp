// test_batch_fit.cpp — --batch auto --memory-budget SIZE, run as a learner runs it. What must hold,
// for a stage without and with sharding, fp32 and bf16, with and without checkpointing:
//   - the chosen micro-batch B fits: every rank's measured device peak (the ledger's) is at most the
//     budget, and equals the predicted peak (zero_formulas.h, expected_device_peak) to the byte;
//   - B + 1 does not: its predicted peak exceeds the budget, and a run with --batch B+1 measures a
//     device peak over the budget too;
//   - --global-batch G sets the accumulation: N x B x accum = G, with B the largest that fits and
//     divides G / N;
//   - zero_estimate --fit SIZE prints the batch the trainer picks.
#include <gtest/gtest.h>

#include <map>

#include "harness.h"
#include "model.h"
#include "zero_formulas.h"  // expected_device_peak

using namespace nz;
using namespace nzt;

namespace {

const std::string kFlags = "--preset tiny --seq 32 --steps 2 --warmup 1 --eval-every 0 --eval-windows 1 ";

struct Case {
  const char* stage;
  int N;
  const char* prec;
  bool ckpt;
  const char* budget;  // as typed
  uint64_t budget_bytes;
};

// run_trainer, once per (trainer, ranks, flags): the last test reuses a run of the first
const RunResult& run(const std::string& stage, int N, const std::string& flags, const std::string& tag) {
  return run_cached(stage, N, flags, tag);
}

uint64_t device_peak(const Json& rank) { return rank["ledger"]["device"]["peak"]["total"].u(); }

}  // namespace

TEST(BatchFit, TheChosenBatchFitsAndOneMoreDoesNot) {
  GPTConfig tiny;
  preset_config("tiny", &tiny);
  for (Case c : {Case{"stage0_ddp", 1, "fp32", false, "2MB", 2000000},
                 Case{"stage3", 3, "bf16", true, "1MiB", 1048576},
                 Case{"offload", 2, "fp32", false, "1.5MB", 1500000}}) {
    SCOPED_TRACE(std::string(c.stage) + " N=" + std::to_string(c.N) + " " + c.prec + (c.ckpt ? " checkpointed" : ""));
    const std::string flags = kFlags + "--precision " + c.prec + (c.ckpt ? " --activation-checkpointing" : "");
    const RunResult& fit = run(c.stage, c.N, flags + " --batch auto --memory-budget " + c.budget, "fit");
    ASSERT_EQ(fit.exit_code, 0) << fit.output;
    const int B = int(fit.report["batch"].u());
    EXPECT_GE(B, 2) << "a budget that fits only one sequence tests little";
    EXPECT_EQ(fit.report["memory_budget"].u(), c.budget_bytes);
    EXPECT_NE(fit.output.find("batch auto: micro-batch " + std::to_string(B) + " per rank"), std::string::npos)
        << fit.output;
    Stage st;
    ASSERT_TRUE(parse_stage(c.stage, &st));
    const DType dt = std::string(c.prec) == "fp32" ? DType::F32 : DType::BF16;
    const Layout L = make_layout(tiny, c.N);
    const uint64_t predicted = expected_device_peak(st, L, B, 32, dt, c.ckpt);
    const uint64_t predicted_next = expected_device_peak(st, L, B + 1, 32, dt, c.ckpt);
    EXPECT_LE(predicted, c.budget_bytes);
    EXPECT_GT(predicted_next, c.budget_bytes) << "batch " << B + 1 << " would fit too";
    ASSERT_EQ(fit.report["ranks"].size(), size_t(c.N));
    for (const Json& rank : fit.report["ranks"].arr) {
      EXPECT_LE(device_peak(rank), c.budget_bytes) << "rank " << rank["rank"].u() << " measured over the budget";
      EXPECT_EQ(device_peak(rank), predicted) << "rank " << rank["rank"].u();
    }
    const RunResult next = run_trainer(c.stage, c.N, flags + " --batch " + std::to_string(B + 1), "fit_next");
    ASSERT_EQ(next.exit_code, 0) << next.output;
    for (const Json& rank : next.report["ranks"].arr)
      EXPECT_GT(device_peak(rank), c.budget_bytes) << "rank " << rank["rank"].u() << ": batch " << B + 1
                                                   << " measured within the budget";
    printf("%s N=%d %s%s, budget %s: batch %d, device peak %llu bytes per rank; batch %d: %llu\n", c.stage, c.N,
           c.prec, c.ckpt ? " checkpointed" : "", c.budget, B, (unsigned long long)predicted, B + 1,
           (unsigned long long)device_peak(next.report["ranks"][size_t(0)]));
  }
}

TEST(BatchFit, GlobalBatchSetsTheAccumulation) {
  GPTConfig tiny;
  preset_config("tiny", &tiny);
  // stage2 on 2 ranks, 2 MB, 20 sequences per rank: the largest micro-batch that fits and divides 20
  const int N = 2, G = 40;
  const Layout L = make_layout(tiny, N);
  const int fit = largest_fitting_batch(Stage::Z2, L, 32, DType::F32, false, 2000000);
  const RunResult r = run_trainer("stage2", N, kFlags + "--batch auto --memory-budget 2MB --global-batch " +
                                  std::to_string(G), "global");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int B = int(r.report["batch"].u()), K = int(r.report["accum"].u());
  EXPECT_EQ(N * B * K, G);
  EXPECT_LE(B, fit);
  for (int b = B + 1; b <= fit; b++) EXPECT_NE((G / N) % b, 0) << "batch " << b << " fits and divides too";
  EXPECT_NE(r.output.find("global batch 40 = 2 ranks x micro-batch " + std::to_string(B) + " x accum " +
                          std::to_string(K)), std::string::npos) << r.output;
  // a fixed batch: the accumulation alone
  const RunResult fixed = run_trainer("stage2", N, kFlags + "--batch 4 --global-batch 24", "global_fixed");
  ASSERT_EQ(fixed.exit_code, 0) << fixed.output;
  EXPECT_EQ(fixed.report["accum"].u(), 3u);
}

TEST(BatchFit, ZeroEstimateFitIsWhatTheTrainerPicks) {
  // the stage3 case above: 3 ranks, bf16, checkpointed, 1 MiB
  std::string out;
  ASSERT_EQ(run_command(bin_dir() + "/zero_estimate --preset tiny --seq 32 --world 3 --precision bf16 --fit 1MiB --json",
                        &out), 0) << out;
  const Json j = Json::parse(out);
  const RunResult& r = run("stage3", 3, kFlags + "--precision bf16 --activation-checkpointing --batch auto "
                           "--memory-budget 1MiB", "estimate");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  bool seen = false;
  for (const Json& e : j["estimates"].arr) {
    if (e["stage"].str != "stage3") continue;
    seen = true;
    EXPECT_EQ(e["fit_batch_checkpointed"].u(), r.report["batch"].u());
    EXPECT_LT(e["fit_batch"].u(), e["fit_batch_checkpointed"].u()) << "checkpointing fits no more";
  }
  EXPECT_TRUE(seen);
}
