// test_zero12.cpp — ZeRO stages 1 and 2 against plain data parallelism, run under mpirun as a
// learner runs them. What must hold (docs/stages.md, "Exactly the same model"; harness.h, the contract):
//   - stage1: every step's loss and grad norm, and the saved model, are bit for bit stage0_ddp's,
//     for N = 1..4 ranks (3 pads the units), with and without accumulation, clipping active;
//   - stage2: the same at accum 1; at accum K > 1 it sums in the other order (reduce every
//     micro-step), so it is bit for bit stage3's instead, and its step-1 gradient norm is within
//     the derived cross-group bound of stage0_ddp's; in bf16 and fp16 too (fp16: the overflowing
//     steps skipped alike, the loss scale lowered and grown alike);
//   - each rank's memory ledger equals the formulas written out below, to the byte;
//   - each rank sends exactly the elements the formulas say, op by op, step by step;
//   - deliberately broken copies of stage2 (tests/stages/stage2_mutants.mk) fail those same checks.
#include <gtest/gtest.h>

#include <map>

#include "harness.h"

using namespace nzt;

namespace {

// The tiny model's grad norm is 1.2 .. 2.6 over these runs: a clip of 0.5 acts on every step.
const std::string kClipText = "0.5";
const double kClip = std::stod(kClipText);
const std::string kFlags =
    "--preset tiny --seq 32 --batch 2 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 --clip " + kClipText + " ";
const int kSteps = 6, kBf16Steps = 20, kFp16Steps = 12;
const char* kStages[] = {"stage1", "stage2"};

std::string flags_for(int accum, const std::string& prec) {
  const int steps = prec == "fp32" ? kSteps : prec == "fp16" ? kFp16Steps : kBf16Steps;
  return kFlags + "--steps " + std::to_string(steps) + " --accum " + std::to_string(accum) + " --precision " + prec +
         fp16_flags(prec, accum);
}

// One run per (trainer, ranks, accum, precision), shared by the tests below.
const RunResult& run(const std::string& trainer, int N, int accum, const std::string& prec = "fp32") {
  return run_cached(trainer, N, flags_for(accum, prec), prec);
}

// The gradient norms of the N * accum micro-batches of step 1 (harness.h, micro_batch_norms).
const std::vector<double>& micro_norms(int N, int accum, const std::string& prec) {
  static std::map<std::string, std::vector<double>> done;
  std::string key = std::to_string(N) + " " + std::to_string(accum) + " " + prec;
  auto it = done.find(key);
  if (it == done.end()) it = done.emplace(key, micro_batch_norms(flags_for(accum, prec), N, accum, prec)).first;
  return it->second;
}

// The contract for `trainer` at (N, accum): stage3 is the sharded group's peer of stage2 and its mutants.
std::vector<std::string> contract(const std::string& trainer, int N, int accum, const std::string& prec,
                                  std::string* summary) {
  const bool local = sums_micro_steps_locally(trainer);
  const bool cross = accum > 1 && !local;
  return contract_problems(trainer, run(trainer, N, accum, prec), N, accum, prec, run("stage0_ddp", N, accum, prec),
                           "stage3", cross ? &run("stage3", N, accum, prec) : nullptr,
                           cross ? &micro_norms(N, accum, prec) : nullptr, summary);
}

}  // namespace

// The headline: sharding changes where the numbers live, not what they are.
TEST(Zero12, Fp32ContractForOneToFourRanks) {
  for (int N : {1, 2, 3, 4}) {
    for (int accum : {1, 3}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(accum));
      const RunResult& ref = run("stage0_ddp", N, accum);
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      std::vector<double> norms = step_values(ref.report, "grad_norm");
      ASSERT_EQ(norms.size(), size_t(kSteps));
      int clipped = 0;
      for (double g : norms) clipped += g > kClip;
      ASSERT_GE(4 * clipped, 3 * kSteps) << "--clip " << kClip << " must act on most steps";
      for (const char* stage : kStages) {
        const RunResult& r = run(stage, N, accum);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        std::string summary;
        std::vector<std::string> problems = contract(stage, N, accum, "fp32", &summary);
        printf("fp32 %s N=%d accum=%d (clipped %d/%d steps): %s\n", stage, N, accum, clipped, kSteps,
               summary.c_str());
        for (const std::string& p : problems) ADD_FAILURE() << stage << ": " << p;
      }
    }
  }
}

// In bf16 the reductions still add in rank order and round once per collective, the same in every
// stage of a group, and the master weights update elementwise: so the contract holds in bf16 too
// (the cross-group bound with the bf16 unit roundoff), and is asserted so.
TEST(Zero12, Bf16ContractOverTwentySteps) {
  for (auto [N, accum] : {std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(accum));
    const RunResult& ref = run("stage0_ddp", N, accum, "bf16");
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(step_values(ref.report, "loss").size(), size_t(kBf16Steps));
    for (const char* stage : kStages) {
      const RunResult& r = run(stage, N, accum, "bf16");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      std::string summary;
      std::vector<std::string> problems = contract(stage, N, accum, "bf16", &summary);
      printf("bf16 %s N=%d accum=%d, %d steps: %s\n", stage, N, accum, kBf16Steps, summary.c_str());
      for (const std::string& p : problems) ADD_FAILURE() << stage << ": " << p;
    }
  }
}

// fp16 (loss-scaled): the same contract. At accum 1 the runs start at DeepSpeed's 2^16 and skip
// their first overflowing steps: every stage must skip the same ones (asserted: at least one).
// At accum 2 the scale grows during the run (harness.h, fp16_flags).
TEST(Zero12, Fp16ContractOverTwelveSteps) {
  for (auto [N, accum] : {std::pair{2, 1}, std::pair{3, 2}}) {
    SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(accum));
    const RunResult& ref = run("stage0_ddp", N, accum, "fp16");
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(step_values(ref.report, "loss").size(), size_t(kFp16Steps));
    const int n_skipped = skipped_steps(ref.report);
    if (accum == 1) {
      EXPECT_GE(n_skipped, 1) << "the accum-1 case must exercise skipped steps";
    }
    for (const char* stage : kStages) {
      const RunResult& r = run(stage, N, accum, "fp16");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      std::string summary;
      std::vector<std::string> problems = contract(stage, N, accum, "fp16", &summary);
      printf("fp16 %s N=%d accum=%d, %d steps (%d skipped in stage0_ddp): %s\n", stage, N, accum, kFp16Steps,
             n_skipped, summary.c_str());
      for (const std::string& p : problems) ADD_FAILURE() << stage << ": " << p;
      if (accum == 1 || sums_micro_steps_locally(stage)) {
        EXPECT_EQ(step_values(r.report, "loss_scale"), step_values(ref.report, "loss_scale"));
      }
    }
  }
}

// Per rank, to the byte. e = bytes per stored element (4 fp32, 2 bf16), P = padded parameters,
// S = this rank's padded shard (P / N), U = the largest padded unit:
//   stage1 (P_os):   params eP, grads eP + eU (the full gradient summed over micro-steps, plus one
//                    unit's gradient of the current micro-step), adam_m 4S, adam_v 4S, master 4S
//                    (bf16 only), no comm buffer (the reduce-scatter runs in place)
//   stage2 (P_os+g): grads eS (only the owned slices survive the reduce-scatter) and one bucket eU
//                    (comm_buffers: where a unit's full gradient lives until it is reduce-scattered)
TEST(Zero12, LedgerMatchesTheFormulasOnEveryRank) {
  struct Case { int N, accum; const char* prec; };
  for (Case c : {Case{1, 1, "fp32"}, Case{2, 1, "fp32"}, Case{3, 1, "fp32"}, Case{4, 1, "fp32"},
                 Case{2, 1, "bf16"}, Case{3, 2, "bf16"}, Case{2, 1, "fp16"}, Case{3, 2, "fp16"}}) {
    for (const char* stage : kStages) {
      SCOPED_TRACE(std::string(stage) + " " + c.prec + " N=" + std::to_string(c.N));
      const RunResult& r = run(stage, c.N, c.accum, c.prec);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const Sizes z = sizes_from_units(r.report, c.N);
      for (int u = 0; u < z.units(); u++) EXPECT_EQ(r.report["units"][u]["padded"].u(), z.padded[u]);
      EXPECT_EQ(r.report["padded_params"].u(), z.P);
      EXPECT_EQ(r.report["shard_params"].u(), z.S);
      EXPECT_EQ(r.report["max_unit_padded"].u(), z.U);
      EXPECT_EQ(z.S * c.N, z.P);
      const uint64_t e = std::string(c.prec) == "fp32" ? 4 : 2, P = z.P, S = z.S, U = z.U;
      const bool stage2 = std::string(stage) == "stage2";
      const std::map<std::string, uint64_t> want = {
          {"params", e * P},        {"grads", stage2 ? e * S : e * P + e * U}, {"master", e == 2 ? 4 * S : 0},
          {"adam_m", 4 * S},        {"adam_v", 4 * S},                 {"comm_buffers", stage2 ? e * U : 0},
          {"gathered", 0}};
      ASSERT_EQ(r.report["ranks"].size(), size_t(c.N));
      for (const Json& rank : r.report["ranks"].arr) {
        const Json& peak = rank["ledger"]["device"]["peak"];
        const Json& host = rank["ledger"]["host"]["peak"];
        for (auto& [cat, bytes] : want) {
          EXPECT_EQ(peak[cat].u(), bytes) << "rank " << rank["rank"].u() << " " << cat;
          EXPECT_EQ(host[cat].u(), 0u) << "rank " << rank["rank"].u() << " " << cat << " on the host";
        }
      }
      // The trainer's own formulas (zero_formulas.cpp) must agree with the ones written out here.
      for (auto& [cat, bytes] : want) EXPECT_EQ(r.report["formula"][cat].u(), bytes) << "formula " << cat;
    }
  }
  for (const char* stage : kStages) {
    const RunResult& r = run(stage, 4, 1);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Json& peak = r.report["ranks"][0]["ledger"]["device"]["peak"];
    const uint64_t total = peak["params"].u() + peak["grads"].u() + peak["adam_m"].u() + peak["adam_v"].u();
    printf("fp32, 4 ranks: %s holds %llu bytes of model state per rank (stage0_ddp: 16P = %llu)\n", stage,
           (unsigned long long)total, (unsigned long long)(16 * r.report["padded_params"].u()));
  }
}

// Elements each rank sends per step, N ranks, K micro-steps, S = shard, over the units:
//   stage0_ddp:  all-reduce 2(N-1)S, once per step (units calls): the local sum needs no traffic
//   stage1:      reduce-scatter (N-1)S once per step (units calls) + all-gather (N-1)S (units calls)
//   stage2:      reduce-scatter K(N-1)S, every micro-step (K * units calls) + all-gather (N-1)S
// With K = 1 all three move exactly the same: reduce-scatter + all-gather = all-reduce. With K > 1
// stage2 sends (K+1)/2 times as much: the price of keeping only a slice of the gradient.
TEST(Zero12, CommLedgerMatchesTheFormulasPerRankPerStep) {
  for (int N : {1, 2, 3, 4}) {
    for (int K : {1, 2, 3}) {
      SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(K));
      for (const char* stage : {"stage0_ddp", "stage1", "stage2"}) {
        const RunResult& r = run(stage, N, K);
        ASSERT_EQ(r.exit_code, 0) << r.output;
        const Sizes z = sizes_from_units(r.report, N);
        const uint64_t S = z.S, n1 = N - 1, units = z.units();
        const bool ddp = std::string(stage) == "stage0_ddp", stage2 = std::string(stage) == "stage2";
        const uint64_t reductions = stage2 ? K : 1;  // reduce-scatters per step, per unit
        // per step: {all_reduce, reduce_scatter, all_gather} elements sent and calls made
        const uint64_t ar = ddp ? 2 * n1 * S : 0, rs = ddp ? 0 : reductions * n1 * S, ag = ddp ? 0 : n1 * S;
        const uint64_t ar_calls = ddp ? units : 0, rs_calls = ddp ? 0 : reductions * units, ag_calls = ddp ? 0 : units;
        const uint64_t per_step = ar + rs + ag;
        if (K == 1 || !stage2) {
          EXPECT_EQ(per_step, 2 * n1 * S) << "one all-reduce's worth";
        }
        EXPECT_EQ(r.report["formula"]["comm_elems_per_step"].u(), per_step);
        for (const Json& s : r.report["steps_log"].arr) EXPECT_EQ(s["comm_elems"].u(), per_step) << stage;
        ASSERT_EQ(r.report["ranks"].size(), size_t(N));
        for (const Json& rank : r.report["ranks"].arr) {
          const Json& c = rank["comm"];
          const std::string who = std::string(stage) + " rank " + std::to_string(rank["rank"].u());
          EXPECT_EQ(c["all_reduce"]["elems_sent"].u(), kSteps * ar) << who;
          EXPECT_EQ(c["reduce_scatter"]["elems_sent"].u(), kSteps * rs) << who;
          EXPECT_EQ(c["all_gather"]["elems_sent"].u(), kSteps * ag) << who;
          // and no model state moved any other way (a broadcast, point-to-point): the ledger's
          // model total is exactly the three collectives above
          EXPECT_EQ(c["model_elems_sent"].u(), kSteps * per_step) << who;
          EXPECT_EQ(c["all_reduce"]["calls"].u(), kSteps * ar_calls) << who;
          EXPECT_EQ(c["reduce_scatter"]["calls"].u(), kSteps * rs_calls) << who;
          EXPECT_EQ(c["all_gather"]["calls"].u(), kSteps * ag_calls) << who;
        }
        if (N == 4)
          printf("%s, 4 ranks, accum %d: %llu elements sent per rank per step\n", stage, K,
                 (unsigned long long)per_step);
      }
    }
  }
}

// fp16's overflow flag (loss_scale.h): one all-reduce of a one-element flag per step, N - 1
// elements sent per rank, in every stage (zero_formulas.h, expected_overflow_flag_elems); none in
// fp32. A skipped step still reduces its gradients but sends no all-gather (nothing was updated).
TEST(Zero12, Fp16OverflowFlagIsOneCollectivePerStep) {
  for (auto [N, K] : {std::pair{2, 1}, std::pair{3, 2}}) {
    for (const char* stage : {"stage0_ddp", "stage1", "stage2"}) {
      SCOPED_TRACE(std::string(stage) + " N=" + std::to_string(N) + " accum=" + std::to_string(K));
      const RunResult& r = run(stage, N, K, "fp16");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const uint64_t n1 = N - 1, S = sizes_from_units(r.report, N).S;
      EXPECT_EQ(r.report["formula"]["overflow_flag_elems_per_step"].u(), n1);
      const bool ddp = std::string(stage) == "stage0_ddp", stage2 = std::string(stage) == "stage2";
      for (const Json& s : r.report["steps_log"].arr) {
        EXPECT_EQ(s["overflow_flag_elems"].u(), n1) << "step " << s["step"].u();
        // a skipped step: stage0's all-reduce and stage1/2's reduce-scatters happened, no all-gather
        const uint64_t reduce = ddp ? 2 * n1 * S : (stage2 ? K : 1) * n1 * S;
        const uint64_t want = s["skipped"].b ? reduce : r.report["formula"]["comm_elems_per_step"].u();
        EXPECT_EQ(s["comm_elems"].u(), want) << "step " << s["step"].u() << (s["skipped"].b ? " (skipped)" : "");
      }
      for (const Json& rank : r.report["ranks"].arr) {
        EXPECT_EQ(rank["comm"]["overflow_flag"]["calls"].u(), uint64_t(kFp16Steps));
        EXPECT_EQ(rank["comm"]["overflow_flag"]["elems_sent"].u(), kFp16Steps * n1);
      }
      const RunResult& f = run(stage, N, K, "fp32");
      ASSERT_EQ(f.exit_code, 0) << f.output;
      EXPECT_EQ(f.report["formula"]["overflow_flag_elems_per_step"].u(), 0u);
      for (const Json& rank : f.report["ranks"].arr) EXPECT_EQ(rank["comm"]["overflow_flag"]["calls"].u(), 0u);
    }
  }
}

// The tests of the tests: each mutant (tests/stages/stage2_mutants.mk) is stage2 with one line broken. It still
// trains, but the contract must tell it from stage2: at N = 3 and accum 3 (slices, averaging over
// ranks and accumulation over micro-steps all matter) it must fail to be stage3's bit for bit, or
// fall outside the cross-group bound of stage0_ddp. Both verdicts are printed for each.
TEST(Zero12, BrokenStage2VariantsAreCaught) {
  const int N = 3, accum = 3;
  for (const char* m : {"no_average", "wrong_slice", "last_microbatch_only"}) {
    const std::string mutant = std::string("mutant_stage2_") + m;
    // a mutant that was not built fails here (run_trainer), never passes as "caught"
    const RunResult& r = run(mutant, N, accum);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string summary;
    std::vector<std::string> problems = contract(mutant, N, accum, "fp32", &summary);
    printf("%s: %s\n", mutant.c_str(), summary.c_str());
    EXPECT_FALSE(problems.empty()) << mutant << " passed the contract: it cannot see this bug";
  }
}
