// test_ddp.cpp — stage0_ddp as a whole, run under mpirun as a learner would run it:
// data parallelism is exact, gradient accumulation is exact, the ledger matches the formula to
// the byte, the model learns, and the saved model reloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "harness.h"

using namespace nzt;

namespace {

const std::string kTiny = "--preset tiny --seq 32 --steps 8 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 8 ";

}  // namespace

// N ranks with micro-batch B == 1 rank with micro-batch N*B, up to fp32 summation order.
// A missing average would multiply the gradient (and its norm) by N: the norms catch it even
// though Adam itself is nearly scale-invariant.
TEST(DDP, NRanksEqualOneRankWithNTimesTheBatch) {
  for (int N : {2, 3, 4}) {
    RunResult one = run_trainer("stage0_ddp", 1, kTiny + "--batch " + std::to_string(2 * N), "one");
    RunResult many = run_trainer("stage0_ddp", N, kTiny + "--batch 2", "many");
    ASSERT_EQ(one.exit_code, 0) << one.output;
    ASSERT_EQ(many.exit_code, 0) << many.output;
    double dl = max_abs_diff(step_values(one.report, "loss"), step_values(many.report, "loss"));
    double dn = max_abs_diff(step_values(one.report, "grad_norm"), step_values(many.report, "grad_norm"));
    double dp = max_param_diff(one.model_path, many.model_path);
    printf("N=%d vs 1 rank x %d: max |loss diff| %.3g, max |grad-norm diff| %.3g, max |param diff| %.3g\n", N, N,
           dl, dn, dp);
    EXPECT_LT(dl, 1e-5);
    EXPECT_LT(dn, 1e-4 * step_values(one.report, "grad_norm")[0]);
    EXPECT_LT(dp, 1e-4);
  }
}

TEST(DDP, AccumulationOfKMicroBatchesEqualsOneBatchKTimesLarger) {
  RunResult big = run_trainer("stage0_ddp", 2, kTiny + "--batch 6", "big");
  RunResult acc = run_trainer("stage0_ddp", 2, kTiny + "--batch 2 --accum 3", "acc");
  ASSERT_EQ(big.exit_code, 0) << big.output;
  ASSERT_EQ(acc.exit_code, 0) << acc.output;
  double dl = max_abs_diff(step_values(big.report, "loss"), step_values(acc.report, "loss"));
  double dn = max_abs_diff(step_values(big.report, "grad_norm"), step_values(acc.report, "grad_norm"));
  double dp = max_param_diff(big.model_path, acc.model_path);
  printf("accum 3 x batch 2 vs batch 6: max |loss diff| %.3g, max |grad-norm diff| %.3g, max |param diff| %.3g\n",
         dl, dn, dp);
  EXPECT_LT(dl, 1e-5);
  EXPECT_LT(dn, 1e-4 * step_values(big.report, "grad_norm")[0]);
  EXPECT_LT(dp, 1e-4);
}

// Per rank: params, grads, Adam m, v = 4Ψ, 4Ψ, 4Ψ, 4Ψ bytes in fp32 and 2Ψ, 2Ψ, 4Ψ (master),
// 4Ψ, 4Ψ in bf16, where Ψ here is the padded count P (each unit padded to a multiple of N): 16
// bytes per parameter. Beside them, one unit's gradient of the current micro-step (eU, ledger:
// grads) on its way into the full gradient; no comm buffer (the all-reduce runs in place).
TEST(DDP, LedgerHoldsSixteenBytesPerParameterOnEveryRank) {
  for (const char* prec : {"fp32", "bf16"}) {
    for (int N : {1, 3}) {
      RunResult r = run_trainer("stage0_ddp", N, kTiny + "--steps 2 --batch 2 --precision " + prec, prec);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const uint64_t P = r.report["padded_params"].u(), e = std::string(prec) == "fp32" ? 4 : 2;
      EXPECT_LT(P - r.report["num_params"].u(), 3u * 4) << "padding is under one element per rank per unit";
      ASSERT_EQ(r.report["ranks"].size(), size_t(N));
      for (const Json& rank : r.report["ranks"].arr) {
        const Json& peak = rank["ledger"]["device"]["peak"];
        EXPECT_EQ(peak["params"].u(), e * P);
        const uint64_t U = r.report["max_unit_padded"].u();
        EXPECT_EQ(peak["grads"].u(), e * P + e * U);
        EXPECT_EQ(peak["master"].u(), e == 2 ? 4 * P : 0);
        EXPECT_EQ(peak["adam_m"].u(), 4 * P);
        EXPECT_EQ(peak["adam_v"].u(), 4 * P);
        EXPECT_EQ(peak["comm_buffers"].u(), 0u);
        EXPECT_EQ(peak["params"].u() + peak["grads"].u() + peak["master"].u() + peak["adam_m"].u() +
                      peak["adam_v"].u(),
                  16 * P + e * U);
      }
    }
  }
}

// One all-reduce of the gradient per optimizer step, whatever the accumulation: the K micro-steps
// are summed locally (PyTorch DDP's no_sync), so the traffic is 2Ψ(N-1)/N per step for any K.
TEST(DDP, CommunicatesTwoPsiTimesNMinusOneOverNPerStepWhateverTheAccumulation) {
  const int N = 3;
  for (int K : {1, 2, 3}) {
    RunResult r = run_trainer("stage0_ddp", N, kTiny + "--steps 3 --batch 2 --accum " + std::to_string(K), "comm");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const uint64_t P = r.report["padded_params"].u(), units = r.report["units"].size();
    for (const Json& s : r.report["steps_log"].arr) EXPECT_EQ(s["comm_elems"].u(), 2 * (N - 1) * (P / N)) << "K=" << K;
    for (const Json& rank : r.report["ranks"].arr)
      EXPECT_EQ(rank["comm"]["all_reduce"]["calls"].u(), 3 * units) << "one all-reduce per unit per step, K=" << K;
  }
}

// The model learns: on the default corpus it beats the unigram baseline by a wide margin.
TEST(DDP, LearnsWellBelowTheUnigramBaseline) {
  RunResult r = run_trainer("stage0_ddp", 2,
                            "--preset tiny --seq 32 --batch 8 --steps 300 --lr 3e-3 --warmup 20 --eval-every 0 "
                            "--eval-windows 32",
                            "learn");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  double val = r.report["final_val_loss"].d(), base = r.report["unigram_baseline"].d();
  printf("tiny, 300 steps: validation loss %.4f vs unigram baseline %.4f\n", val, base);
  EXPECT_LT(val, base - 0.5);
}

// The saved model reloads: gpt_eval on the same validation windows gives the trainer's loss.
TEST(DDP, SavedModelReproducesTheValidationLoss) {
  RunResult r = run_trainer("stage0_ddp", 2, kTiny + "--batch 2 --eval-windows 12", "save");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string out;
  int rc = run_command(bin_dir() + "/gpt_eval --model " + r.model_path + " --data data/corpus.txt --split val --seq 32 --windows 12", &out);
  ASSERT_EQ(rc, 0) << out;
  double v = 0;
  ASSERT_EQ(sscanf(out.c_str(), "mean cross-entropy: %lf", &v), 1) << out;
  printf("trainer %.6f, gpt_eval %.6f\n", r.report["final_val_loss"].d(), v);
  EXPECT_NEAR(v, r.report["final_val_loss"].d(), 1e-5);
}
