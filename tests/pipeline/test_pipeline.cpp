// test_pipeline.cpp — pipeline/train.cpp as a whole, under mpirun: P stages x D replicas are
// stage0_ddp on D ranks with --accum K bit for bit (every step's loss and norm, the validation
// loss and the model file), with clipping active, for both schedules; every rank's ledger holds
// its stage's formula to the byte; bad input is one line and exit 2 with nothing written; and the
// deliberately broken pipelines (tests/pipeline/mutants.mk) are caught.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <map>

#include "harness.h"
#include "kernels/kernels.h"  // Attention
#include "model.h"            // stage_activation_bytes: the model's own allocation
#include "pipeline.h"         // stage_ops, activation_slots
#include "zero_formulas.h"    // pipeline_activation_bytes, expected_activation_bytes

using namespace nzt;

namespace {

// tiny: 2 blocks, so 4 units (embed, 2 blocks, lnf) and at most 4 stages. --clip 0.5 clips every
// step (the norms are above 2). Two steps: the second trains on what the first update produced.
const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --steps 2 --lr 3e-3 --warmup 1 --clip 0.5 --eval-every 0 --eval-windows 4 ";

// The fast CPU kernels' bits depend on the thread count, and a pipeline of P x D ranks would get
// fewer threads per rank than stage0_ddp on D ranks: one thread everywhere (trainer.cpp).
struct OneThread {
  OneThread() { setenv("OMP_NUM_THREADS", "1", 1); }
} one_thread;

std::string pipeline_flags(int P, const char* schedule, int K) {
  return "--pipeline " + std::to_string(P) + " --schedule " + schedule + " --accum " + std::to_string(K) + " ";
}

// The whole matrix for one precision: P = 1..4, D = 1, 2, K = 1..6, both schedules (P = 1 once).
void expect_matrix_equal(const std::string& precision_flags) {
  const auto t0 = std::chrono::steady_clock::now();
  int runs = 0;
  for (int D : {1, 2}) {
    for (int K = 1; K <= 6; K++) {
      const std::string acc = "--accum " + std::to_string(K) + " ";
      RunResult ref = run_trainer("stage0_ddp", D, kTiny + precision_flags + acc, "ref");
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      for (int P = 1; P <= 4; P++) {
        for (const char* schedule : {"1f1b", "gpipe"}) {
          if (P == 1 && std::string(schedule) == "gpipe") continue;  // one stage: the schedules agree
          RunResult r = run_trainer("pipeline", P * D, kTiny + precision_flags + pipeline_flags(P, schedule, K), "pp");
          runs++;
          ASSERT_EQ(r.exit_code, 0) << r.output;
          const Verdict v = compare_runs(ref, r);
          EXPECT_TRUE(v.identical()) << "P=" << P << " D=" << D << " K=" << K << " " << schedule << ": " << v.str();
          EXPECT_EQ(ref.report["final_val_loss"].d(), r.report["final_val_loss"].d())
              << "P=" << P << " D=" << D << " K=" << K << " " << schedule;
        }
      }
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("%s: %d pipeline runs (P 1..4 x D 1,2 x K 1..6 x gpipe, 1f1b) each bit for bit stage0_ddp --accum K, %.1f s\n",
         precision_flags.c_str(), runs, s);
}

}  // namespace

// ---- the schedules themselves, without running anything ----

// Every micro-batch forward once and backward once, a backward after its own forward, the backwards
// in ascending order, and never more in flight than the slots.
TEST(PipelineSchedule, EveryMicroBatchOnceBackwardsAscendingWithinTheSlots) {
  for (nz::PipeSchedule sch : {nz::PipeSchedule::GPipe, nz::PipeSchedule::OneFOneB})
    for (int P = 1; P <= 5; P++)
      for (int s = 0; s < P; s++)
        for (int K = 1; K <= 9; K++) {
          const auto ops = nz::stage_ops(sch, P, s, K);
          ASSERT_EQ(ops.size(), size_t(2 * K));
          int next_f = 0, next_b = 0, in_flight = 0, most = 0;
          for (const nz::PipeOp& op : ops) {
            if (op.forward) {
              EXPECT_EQ(op.micro, next_f++);
              most = std::max(most, ++in_flight);
            } else {
              EXPECT_EQ(op.micro, next_b++) << "backwards in ascending order";
              EXPECT_LT(op.micro, next_f) << "a backward after its forward";
              in_flight--;
            }
          }
          const int slots = nz::activation_slots(sch, P, s, K);
          EXPECT_EQ(most, slots) << nz::schedule_name(sch) << " P=" << P << " s=" << s << " K=" << K;
          EXPECT_EQ(slots, sch == nz::PipeSchedule::GPipe ? K : std::min(P - s, K));
          if (sch == nz::PipeSchedule::OneFOneB) {  // warm-up: P-s-1 forwards before the first backward
            int warm = 0;
            while (warm < int(ops.size()) && ops[warm].forward) warm++;
            EXPECT_EQ(warm, std::min(P - s, K));
          }
        }
}

// ---- equality: the project's contract ----

TEST(Pipeline, EqualsStage0DdpWithAccumBitForBitFp32) { expect_matrix_equal("--precision fp32 "); }
TEST(Pipeline, EqualsStage0DdpWithAccumBitForBitBf16) { expect_matrix_equal("--precision bf16 "); }

// fp16 with loss scaling (a static scale small enough that no step overflows): a few corners.
TEST(Pipeline, EqualsStage0DdpWithAccumBitForBitFp16) {
  const std::string fp16 = "--precision fp16 --loss-scale 1024 --loss-scale-window 0 ";
  for (int K : {1, 4}) {
    RunResult ref = run_trainer("stage0_ddp", 2, kTiny + fp16 + "--accum " + std::to_string(K), "ref16");
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    for (int P : {2, 4})
      for (const char* schedule : {"1f1b", "gpipe"}) {
        RunResult r = run_trainer("pipeline", 2 * P, kTiny + fp16 + pipeline_flags(P, schedule, K), "pp16");
        ASSERT_EQ(r.exit_code, 0) << r.output;
        EXPECT_EQ(skipped_steps(r.report), 0);
        const Verdict v = compare_runs(ref, r);
        EXPECT_TRUE(v.identical()) << "fp16 P=" << P << " K=" << K << " " << schedule << ": " << v.str();
      }
  }
}

// An explicit partition trains the same model as the balanced one (and as stage0_ddp).
TEST(Pipeline, ExplicitPartitionAndActivationCheckpointingStayBitForBit) {
  for (const std::string extra : {"", "--activation-checkpointing "}) {
    RunResult ref = run_trainer("stage0_ddp", 1, kTiny + extra + "--accum 3", "ref");
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    for (const char* partition : {"1", "3", "2,3"}) {
      const int P = std::string(partition) == "2,3" ? 3 : 2;
      RunResult r = run_trainer("pipeline", P,
                                kTiny + extra + pipeline_flags(P, "1f1b", 3) + "--partition " + partition, "part");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const Verdict v = compare_runs(ref, r);
      EXPECT_TRUE(v.identical()) << "--partition " << partition << " " << extra << ": " << v.str();
    }
  }
}

// ---- memory, to the byte ----

// Stage s holds its units' params, grads (+ one unit's incoming gradient), Adam m, v (every size
// recomputed here from the report's units and the partition), the last stage its copy of wte and
// the head's d wte; its activations are `slots` micro-batches' worth plus one set of gradients: K
// slots under GPipe, min(P-s, K) under 1F1B. The model's allocation (model.cpp), the formula
// written term by term (zero_formulas.cpp) and the ledger agree on every rank.
TEST(Pipeline, LedgerHoldsEachStagesUnitsAndActivationSlotsToTheByte) {
  const int P = 4, K = 8;
  std::map<std::string, std::vector<uint64_t>> acts_by_schedule;
  for (int D : {1, 2}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      RunResult r = run_trainer("pipeline", P * D, kTiny + pipeline_flags(P, schedule, K) + "--steps 1", "mem");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      const Sizes z = sizes_from_units(r.report, D);
      const Json& pp = r.report["pipeline"];
      std::vector<int> first;
      for (const Json& f : pp["first_unit"].arr) first.push_back(int(f.u()));
      ASSERT_EQ(first.size(), size_t(P + 1));
      const uint64_t e = 4, VC = r.report["config"]["vocab"].u() * r.report["config"]["dim"].u();
      nz::GPTConfig cfg;
      ASSERT_TRUE(nz::preset_config("tiny", &cfg));
      nz::PipelinePlan plan;
      plan.stages = P;
      plan.replicas = D;
      plan.schedule = std::string(schedule) == "gpipe" ? nz::PipeSchedule::GPipe : nz::PipeSchedule::OneFOneB;
      plan.first_unit = first;
      ASSERT_EQ(r.report["ranks"].size(), size_t(P * D));
      std::vector<uint64_t> acts;
      for (const Json& rank : r.report["ranks"].arr) {
        const int s = int(rank["rank"].u()) / D;
        uint64_t Ps = 0, Us = 0;
        for (int u = first[s]; u < first[s + 1]; u++) Ps += z.padded[u], Us = std::max(Us, z.padded[u]);
        const uint64_t tied = s == P - 1 ? e * VC : 0;
        const Json& peak = rank["ledger"]["device"]["peak"];
        EXPECT_EQ(peak["params"].u(), e * Ps + tied) << schedule << " stage " << s;
        EXPECT_EQ(peak["grads"].u(), e * Ps + e * Us + tied) << schedule << " stage " << s;
        EXPECT_EQ(peak["adam_m"].u(), 4 * Ps);
        EXPECT_EQ(peak["adam_v"].u(), 4 * Ps);
        EXPECT_EQ(peak["master"].u(), 0u);
        EXPECT_EQ(peak["comm_buffers"].u(), 0u);
        const int slots = std::string(schedule) == "gpipe" ? K : std::min(P - s, K);
        const uint64_t formula =
            nz::pipeline_activation_bytes(cfg, 2, 32, nz::DType::F32, false, nz::Attention::Gemm, plan, s, K);
        const uint64_t allocated =
            nz::stage_activation_bytes(cfg, 2, 32, nz::DType::F32, false, nz::Attention::Gemm, first[s], first[s + 1], slots);
        EXPECT_EQ(peak["activations"].u(), formula) << schedule << " stage " << s;
        EXPECT_EQ(allocated, formula) << schedule << " stage " << s;
        if (D == 1) acts.push_back(peak["activations"].u());
      }
      if (D == 1) acts_by_schedule[schedule] = acts;
    }
  }
  // with one stage and one slot, the pipeline's formula is stage0_ddp's
  nz::GPTConfig cfg;
  ASSERT_TRUE(nz::preset_config("tiny", &cfg));
  nz::PipelinePlan one;
  one.first_unit = {0, cfg.layers + 2};
  EXPECT_EQ(nz::pipeline_activation_bytes(cfg, 2, 32, nz::DType::F32, false, nz::Attention::Gemm, one, 0, 1),
            nz::expected_activation_bytes(cfg, 2, 32, nz::DType::F32, false));
  printf("activation bytes per stage at P=4, K=8 (ledger = formula on every rank):\n");
  for (const auto& [schedule, acts] : acts_by_schedule) {
    printf("  %-5s", schedule.c_str());
    for (uint64_t a : acts) printf(" %10llu", (unsigned long long)a);
    printf("\n");
  }
  for (int s = 0; s < P; s++) EXPECT_LT(acts_by_schedule["1f1b"][s], acts_by_schedule["gpipe"][s]) << "stage " << s;
  // zero_estimate --pipeline prints the same activations per stage, allocating nothing
  for (const auto& [schedule, acts] : acts_by_schedule) {
    std::string out;
    ASSERT_EQ(run_command(bin_dir() + "/zero_estimate --preset tiny --batch 2 --seq 32 --pipeline 4 --accum 8 --schedule " +
                              schedule, &out), 0) << out;
    for (int s = 0; s < P; s++) {
      const size_t row = out.find("\n" + std::to_string(s) + " ");
      ASSERT_NE(row, std::string::npos) << out;
      char units[32];
      unsigned long long v[5], slots = 0, a = 0;
      ASSERT_EQ(sscanf(out.c_str() + row + 1, "%*d %31s %llu %llu %llu %llu %llu %llu %llu", units, &v[0], &v[1], &v[2],
                       &v[3], &v[4], &slots, &a), 8) << out;
      EXPECT_EQ(a, acts[s]) << "zero_estimate, " << schedule << " stage " << s << "\n" << out;
      EXPECT_EQ(slots, unsigned(schedule == "gpipe" ? K : std::min(P - s, K)));
    }
  }
}

// The bubble is measured on every rank: compute and wait times, the idle fraction beside (P-1)/(K+P-1).
TEST(Pipeline, ReportsTheMeasuredBubbleBesideTheFormula) {
  for (int K : {1, 4, 8}) {
    RunResult r = run_trainer("pipeline", 4, kTiny + pipeline_flags(4, "1f1b", K) + "--steps 3", "bubble");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Json& pp = r.report["pipeline"];
    EXPECT_DOUBLE_EQ(pp["bubble_formula"].d(), 3.0 / (K + 3));
    printf("P=4 K=%d: formula %.3f, measured idle per stage", K, pp["bubble_formula"].d());
    for (const Json& rank : pp["ranks"].arr) {
      EXPECT_GT(rank["compute_s"].d(), 0);
      EXPECT_GE(rank["idle"].d(), 0);
      EXPECT_LT(rank["idle"].d(), 1);
      printf(" %.3f", rank["idle"].d());
    }
    printf("\n");
  }
}

// ---- bad input: one line, exit 2, nothing written ----
TEST(Pipeline, BadInputIsOneLineAndExitTwoWithNothingWritten) {
  struct Case {
    int np;
    std::string flags, says;
  };
  const Case cases[] = {
      {3, "--pipeline 2", "does not divide the 3 ranks"},
      {5, "--pipeline 5", "more stages than the model's 4 units"},
      {2, "--pipeline 2 --partition 0", "leaves a stage empty"},
      {3, "--pipeline 3 --partition 2,1", "leaves a stage empty"},
      {2, "--pipeline 2 --partition 4", "past the last unit"},
      {2, "--pipeline 2 --partition 1,2", "2 boundaries for --pipeline 2"},
      {2, "--pipeline 2 --partition x", "not a list of unit numbers"},
      {2, "--pipeline 2 --schedule zigzag", "unknown pipeline schedule"},
  };
  for (const Case& c : cases) {
    RunResult r = run_trainer("pipeline", c.np, kTiny + c.flags, "bad");
    EXPECT_EQ(r.exit_code, 2) << c.flags << "\n" << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.flags << ": " << r.output;
    size_t lines = 0;
    for (char ch : r.output) lines += ch == '\n';
    EXPECT_EQ(lines, 1u) << c.flags << ": " << r.output;
    struct stat st;
    EXPECT_NE(stat(r.model_path.c_str(), &st), 0) << "a model file was written: " << c.flags;
    EXPECT_NE(stat((r.model_path.substr(0, r.model_path.size() - 6) + ".json").c_str(), &st), 0)
        << "a report was written: " << c.flags;
  }
  // the pipeline's flags belong to the pipeline
  RunResult r = run_trainer("stage0_ddp", 1, kTiny + "--pipeline 2", "bad");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("build/bin/pipeline only"), std::string::npos) << r.output;
}

// ---- the tests of the tests: each deliberately broken pipeline is caught ----
TEST(Pipeline, BrokenPipelinesAreCaught) {
  // P = 2, D = 2, K = 3: GPipe (the reversed backwards are GPipe's), two replicas (the wrong
  // neighbour is another replica's stage), K > 2 (a sum of two is the same in either order)
  const std::string flags = kTiny + pipeline_flags(2, "gpipe", 3);
  RunResult ref = run_trainer("stage0_ddp", 2, kTiny + "--accum 3", "ref");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  RunResult good = run_trainer("pipeline", 4, flags, "good");
  ASSERT_EQ(good.exit_code, 0) << good.output;
  EXPECT_TRUE(compare_runs(ref, good).identical()) << "the real pipeline must pass the check its mutants fail";
  for (const char* m : {"reverse_backward", "grad_scaled_by_k", "tied_not_combined", "wrong_neighbour"}) {
    RunResult r = run_trainer(std::string("mutant_pipeline_") + m, 4, flags, m);
    if (r.exit_code != 0) {
      printf("mutant_pipeline_%s: failed to run (exit %d): caught\n", m, r.exit_code);
      continue;
    }
    const Verdict v = compare_runs(ref, r);
    printf("mutant_pipeline_%s: %s\n", m, v.str().c_str());
    EXPECT_FALSE(v.identical()) << "mutant_pipeline_" << m << " was not caught";
  }
}
