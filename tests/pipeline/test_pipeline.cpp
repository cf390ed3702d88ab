// test_pipeline.cpp — pipeline/train.cpp as a whole, under mpirun: P segments x D replicas are
// stage0_ddp on D ranks with --accum K bit for bit (every step's loss and norm, the validation
// loss and the model file), with clipping active, for both schedules; every rank's ledger holds
// its segment's formula to the byte; bad input is one line and exit 2 with nothing written; and the
// deliberately broken pipelines (tests/pipeline/mutants.mk) are caught.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <map>

#include "harness.h"
#include "kernels/kernels.h"  // Attention
#include "model.h"            // segment_activation_bytes: the model's own allocation
#include "pipeline/pipeline.h"  // segment_ops, activation_slots
#include "pipeline/formulas.h"  // pipeline_activation_bytes
#include "zero_formulas.h"      // expected_activation_bytes

using namespace nzt;

namespace {

// tiny: 2 blocks, so 4 units (embed, 2 blocks, lnf) and at most 4 segments. --clip 0.5 clips every
// step (the norms are above 2). Two steps: the second trains on what the first update produced.
const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --steps 2 --lr 3e-3 --warmup 1 --clip 0.5 --eval-every 0 --eval-windows 4 ";

// The fast CPU kernels' bits depend on the thread count, and a pipeline of P x D ranks would get
// fewer threads per rank than stage0_ddp on D ranks: one thread everywhere (trainer.cpp).
// This suite's cost is its launches (about 200, of up to 8 ranks, every one a correct run): MPICH's
// shared-memory set-up waits for every rank in a loop that never yields, so on two cores the ranks
// that started first spin while the rest load. MPIR_CVAR_NOLOCAL=1 leaves that set-up out (ranks
// then talk through UCX's own shared memory): this suite took 84 CPU-s with it, 62 without.
// Every sum over ranks is the project's own, in rank order, so the bits are the same
// (dev/golden_runs.sh under it: 0 files differ). Set unless the environment says otherwise.
struct OneThread {
  OneThread() {
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("MPIR_CVAR_NOLOCAL", "1", 0);
  }
} one_thread;

// Runs that several tests compare against (stage0_ddp's references, the real pipeline beside its
// mutants) are launched once per process: the launches, not the training, cost this suite its time.
const RunResult& shared_run(const std::string& trainer, int np, const std::string& flags) {
  return run_cached(trainer, np, flags, "shared");  // harness.h: shared with the other suites too
}

std::string pipeline_flags(int P, const char* schedule, int K) {
  return "--pipeline " + std::to_string(P) + " --schedule " + schedule + " --accum " + std::to_string(K) + " ";
}

// The matrix for one precision: P = 1..4, D = 1, 2, both schedules (P = 1 once), and for each P
// K = 1..P+2, which meets every shape a schedule takes on some segment (1F1B's warm-up min(P-s-1, K)
// short of, equal to and past P-s-1; the slots min(P-s, K) filled, reused once and twice); a larger
// K repeats the shape of K = P + 2 with more steady-state pairs (each launch costs more than its
// training: the matrix once ran those repeats too in fp32, 96 launches where 78 meet every shape).
void expect_matrix_equal(const std::string& precision_flags) {
  const auto t0 = std::chrono::steady_clock::now();
  int runs = 0;
  for (int D : {1, 2}) {
    for (int K = 1; K <= 6; K++) {
      const std::string acc = "--accum " + std::to_string(K) + " ";
      const RunResult& ref = shared_run("stage0_ddp", D, kTiny + precision_flags + acc);
      ASSERT_EQ(ref.exit_code, 0) << ref.output;
      for (int P = 1; P <= 4; P++) {
        for (const char* schedule : {"1f1b", "gpipe"}) {
          if (P == 1 && std::string(schedule) == "gpipe") continue;  // one segment: the schedules agree
          if (K > P + 2) continue;  // the shape of K = P + 2 again
          const RunResult& r = shared_run("pipeline", P * D, kTiny + precision_flags + pipeline_flags(P, schedule, K));
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
  printf("%s: %d pipeline runs (P 1..4 x D 1,2 x K 1..min(6, P+2) x gpipe, 1f1b) each bit for bit stage0_ddp "
         "--accum K, %.1f s\n", precision_flags.c_str(), runs, s);
}

// Each rank's events (the last step's stretches of compute and wait, report["pipeline"]) run its
// schedule's ops in segment_ops's order, each op once, in time order.
void expect_events_follow_the_schedule(const Json& report, nz::PipeSchedule schedule, int K, const std::string& what) {
  const Json& pp = report["pipeline"];
  const int P = int(pp["segments"].u()), D = int(pp["replicas"].u());
  for (size_t r = 0; r < pp["ranks"].size(); r++) {
    const int s = int(r) / D;
    std::vector<std::pair<bool, int>> ran;  // the ops, consecutive stretches of one op taken once
    double last_t = -1;
    for (const Json& ev : pp["ranks"][r]["events"].arr) {
      const std::pair<bool, int> op{ev[0].str == "F", int(ev[1].u())};
      if (ran.empty() || ran.back() != op) ran.push_back(op);
      EXPECT_GE(ev[3].d(), last_t) << what << " rank " << r;
      EXPECT_GE(ev[4].d(), ev[3].d()) << what << " rank " << r;
      last_t = ev[4].d();
    }
    std::vector<std::pair<bool, int>> want;
    for (const nz::PipeOp& op : nz::segment_ops(schedule, P, s, K)) want.push_back({op.forward, op.micro});
    EXPECT_EQ(ran, want) << what << " rank " << r << " (segment " << s << ")";
  }
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
          const auto ops = nz::segment_ops(sch, P, s, K);
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

// Every schedule shape, in fp32 and in bf16 (the storage type's sends, accumulation and master weights).
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
    const RunResult& ref = shared_run("stage0_ddp", 1, kTiny + "--precision fp32 " + extra + "--accum 3 ");
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

// Segment s holds its units' params, grads (+ one unit's incoming gradient), Adam m, v (every size
// recomputed here from the report's units and the partition), the last segment its copy of wte and
// the head's d wte; its activations are `slots` micro-batches' worth plus one set of gradients: K
// slots under GPipe, min(P-s, K) under 1F1B. The model's allocation (model.cpp), the formula
// written term by term (zero_formulas.cpp) and the ledger agree on every rank.
TEST(Pipeline, LedgerHoldsEachSegmentsUnitsAndActivationSlotsToTheByte) {
  const int P = 4, K = 8;
  std::map<std::string, std::vector<uint64_t>> acts_by_schedule;
  for (int D : {1, 2}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      const RunResult& r = shared_run("pipeline", P * D, kTiny + "--precision fp32 " + pipeline_flags(P, schedule, K));
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
      plan.segments = P;
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
        EXPECT_EQ(peak["params"].u(), e * Ps + tied) << schedule << " segment " << s;
        EXPECT_EQ(peak["grads"].u(), e * Ps + e * Us + tied) << schedule << " segment " << s;
        EXPECT_EQ(peak["adam_m"].u(), 4 * Ps);
        EXPECT_EQ(peak["adam_v"].u(), 4 * Ps);
        EXPECT_EQ(peak["master"].u(), 0u);
        EXPECT_EQ(peak["comm_buffers"].u(), 0u);
        const int slots = std::string(schedule) == "gpipe" ? K : std::min(P - s, K);
        const uint64_t formula =
            nz::pipeline_activation_bytes(cfg, 2, 32, nz::DType::F32, false, nz::Attention::Gemm, plan, s, K);
        const uint64_t allocated =
            nz::segment_activation_bytes(cfg, 2, 32, nz::DType::F32, false, nz::Attention::Gemm, first[s], first[s + 1], slots);
        EXPECT_EQ(peak["activations"].u(), formula) << schedule << " segment " << s;
        // point-to-point, the run's whole count (2 steps; the final validation: 4 windows over D
        // replicas in batches of B = 2, all full; the model file: segment s > 0 of replica 0 sends its
        // units to rank 0). Per step: K activations (B,T,C) forward, K gradients back, K head d wte
        // (V,C) from the last segment to the first, and the fresh wte back (once more at the start).
        const uint64_t BTC = 2 * 32 * r.report["config"]["dim"].u(), steps = 2, val_rows = 4 / D;
        const bool to_next = s < P - 1, to_prev = s > 0, head = s == P - 1, embed = s == 0;
        uint64_t later_units = 0;  // the units of segments 1.. (rank 0 receives them for the model file)
        for (int u = first[1]; u < first[P]; u++) later_units += z.padded[u];
        const int rank_id = int(rank["rank"].u());
        const uint64_t sent = steps * K * BTC * (to_next + to_prev) + steps * K * VC * head + (steps + 1) * VC * embed +
                              val_rows * 32 * r.report["config"]["dim"].u() * to_next +
                              (rank_id == s * D && s > 0 ? Ps : 0);
        const uint64_t recv = steps * K * BTC * (to_next + to_prev) + steps * K * VC * embed + (steps + 1) * VC * head +
                              val_rows * 32 * r.report["config"]["dim"].u() * to_prev + (rank_id == 0 ? later_units : 0);
        const Json& p2p = rank["comm"]["p2p"];
        EXPECT_EQ(p2p["elems_sent"].u(), sent) << schedule << " rank " << rank_id;
        EXPECT_EQ(p2p["bytes_sent"].u(), e * sent) << schedule << " rank " << rank_id;
        EXPECT_EQ(p2p["bytes_recv"].u(), e * recv) << schedule << " rank " << rank_id;
        EXPECT_EQ(allocated, formula) << schedule << " segment " << s;
        if (D == 1) acts.push_back(peak["activations"].u());
      }
      expect_events_follow_the_schedule(r.report, plan.schedule, K, schedule);
      if (D == 1) acts_by_schedule[schedule] = acts;
    }
  }
  // with one segment and one slot, the pipeline's formula is stage0_ddp's
  nz::GPTConfig cfg;
  ASSERT_TRUE(nz::preset_config("tiny", &cfg));
  nz::PipelinePlan one;
  one.first_unit = {0, cfg.layers + 2};
  EXPECT_EQ(nz::pipeline_activation_bytes(cfg, 2, 32, nz::DType::F32, false, nz::Attention::Gemm, one, 0, 1),
            nz::expected_activation_bytes(cfg, 2, 32, nz::DType::F32, false));
  printf("activation bytes per segment at P=4, K=8 (ledger = formula on every rank):\n");
  for (const auto& [schedule, acts] : acts_by_schedule) {
    printf("  %-5s", schedule.c_str());
    for (uint64_t a : acts) printf(" %10llu", (unsigned long long)a);
    printf("\n");
  }
  for (int s = 0; s < P; s++) EXPECT_LT(acts_by_schedule["1f1b"][s], acts_by_schedule["gpipe"][s]) << "segment " << s;
  // zero_estimate --pipeline prints the same activations per segment, allocating nothing
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
      EXPECT_EQ(a, acts[s]) << "zero_estimate, " << schedule << " segment " << s << "\n" << out;
      EXPECT_EQ(slots, unsigned(schedule == "gpipe" ? K : std::min(P - s, K)));
    }
  }
}

// The bubble is measured on every rank: compute and wait times, the idle fraction beside (P-1)/(K+P-1).
TEST(Pipeline, ReportsTheMeasuredBubbleBesideTheFormula) {
  for (int K : {1, 4, 8}) {
    // the matrix's runs (K = 1, 4) and the ledger's (K = 8)
    const RunResult& r = shared_run("pipeline", 4, kTiny + "--precision fp32 " + pipeline_flags(4, "1f1b", K));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Json& pp = r.report["pipeline"];
    EXPECT_DOUBLE_EQ(pp["bubble_formula"].d(), 3.0 / (K + 3));
    expect_events_follow_the_schedule(r.report, nz::PipeSchedule::OneFOneB, K, "1f1b K=" + std::to_string(K));
    printf("P=4 K=%d: formula %.3f, measured idle per segment", K, pp["bubble_formula"].d());
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
      {5, "--pipeline 5", "more segments than the model's 4 units"},
      {2, "--pipeline 2 --partition 0", "leaves a segment empty"},
      {3, "--pipeline 3 --partition 2,1", "leaves a segment empty"},
      {2, "--pipeline 2 --partition 4", "past the last unit"},
      {2, "--pipeline 2 --partition 1,2", "2 boundaries for --pipeline 2"},
      {2, "--pipeline 2 --partition x", "not a list of unit numbers"},
      {2, "--pipeline 2 --schedule zigzag", "unknown pipeline schedule"},
      {4, "--pipeline 2 --zero 2", "--zero 2: ZeRO-2 shards the gradient, but in a pipeline a unit's gradient "
                                   "accumulates over K micro-batches whose backwards arrive at different times"},
      {4, "--pipeline 2 --zero 3", "--zero 3: ZeRO-3 shards the gradient"},
      {4, "--pipeline 2 --zero 4", "--zero 4"},
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
  for (const char* flag : {"--pipeline 2", "--zero 1"}) {
    RunResult r = run_trainer("stage0_ddp", 1, kTiny + flag, "bad");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    // (the tensor rung takes them too, for 3D: the line names both, in either order)
    EXPECT_NE(r.output.find("build/bin/pipeline"), std::string::npos) << flag << ": " << r.output;
    EXPECT_NE(r.output.find(" only;"), std::string::npos) << flag << ": " << r.output;
  }
}

// ---- ZeRO-1 inside the replicas (--zero 1) ----

// Each segment's optimizer state sharded over its D replicas is stage1 on D ranks with --accum K, and so
// stage0_ddp (all-reduce = reduce-scatter + all-gather, bit for bit): every step's loss and norm and
// the model file. Every rank's Adam m, v (and bf16's master) are its segment's P_s / D, recomputed here
// from the report's units; params and grads as without it. D = 3 pads every unit to a multiple of 3.
TEST(Pipeline, ZeroOneInsideTheReplicasIsStage1BitForBitWithTheOptimizerStateSharded) {
  struct Case {
    int P, D, K;
    const char *precision, *schedule;
  };
  for (const Case c : {Case{2, 2, 3, "fp32", "1f1b"}, Case{4, 2, 4, "bf16", "gpipe"}, Case{2, 3, 2, "fp32", "1f1b"}}) {
    const std::string prec = std::string("--precision ") + c.precision + " ", acc = "--accum " + std::to_string(c.K) + " ";
    const std::string what = "P=" + std::to_string(c.P) + " D=" + std::to_string(c.D) + " K=" + std::to_string(c.K) +
                             " " + c.precision + " " + c.schedule;
    const RunResult& ddp = shared_run("stage0_ddp", c.D, kTiny + prec + acc);
    RunResult z1 = run_trainer("stage1", c.D, kTiny + prec + acc, "z1");
    RunResult r = run_trainer("pipeline", c.P * c.D, kTiny + prec + pipeline_flags(c.P, c.schedule, c.K) + "--zero 1",
                              "pz1");
    ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
    ASSERT_EQ(z1.exit_code, 0) << z1.output;
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(compare_runs(z1, r).identical()) << what << " against stage1: " << compare_runs(z1, r).str();
    EXPECT_TRUE(compare_runs(ddp, r).identical()) << what << " against stage0_ddp: " << compare_runs(ddp, r).str();
    const Sizes z = sizes_from_units(r.report, c.D);
    std::vector<int> first;
    for (const Json& f : r.report["pipeline"]["first_unit"].arr) first.push_back(int(f.u()));
    ASSERT_EQ(first.size(), size_t(c.P + 1));
    const uint64_t e = std::string(c.precision) == "fp32" ? 4 : 2;
    const uint64_t VC = r.report["config"]["vocab"].u() * r.report["config"]["dim"].u();
    for (const Json& rank : r.report["ranks"].arr) {
      const int s = int(rank["rank"].u()) / c.D;
      uint64_t Ps = 0;
      for (int u = first[s]; u < first[s + 1]; u++) Ps += z.padded[u];
      const Json& peak = rank["ledger"]["device"]["peak"];
      EXPECT_EQ(peak["adam_m"].u(), 4 * Ps / c.D) << what << " rank " << rank["rank"].u();
      EXPECT_EQ(peak["adam_v"].u(), 4 * Ps / c.D) << what << " rank " << rank["rank"].u();
      EXPECT_EQ(peak["master"].u(), e == 4 ? 0 : 4 * Ps / c.D) << what << " rank " << rank["rank"].u();
      EXPECT_EQ(peak["params"].u(), e * Ps + (s == c.P - 1 ? e * VC : 0)) << what << " rank " << rank["rank"].u();
    }
    // zero_estimate --pipeline P --world N --zero 1 prints the same optimizer state per segment, running nothing
    std::string out;
    ASSERT_EQ(run_command(bin_dir() + "/zero_estimate --preset tiny --batch 2 --seq 32 --precision " + c.precision +
                              " --pipeline " + std::to_string(c.P) + " --world " + std::to_string(c.P * c.D) +
                              " --schedule " + c.schedule + " --zero 1", &out), 0) << out;
    for (int s = 0; s < c.P; s++) {
      uint64_t Ps = 0;
      for (int u = first[s]; u < first[s + 1]; u++) Ps += z.padded[u];
      const size_t row = out.find("\n" + std::to_string(s) + " ");
      ASSERT_NE(row, std::string::npos) << out;
      unsigned long long v[5];
      ASSERT_EQ(sscanf(out.c_str() + row + 1, "%*d %*s %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4]), 5);
      EXPECT_EQ(v[3], 4 * Ps / c.D) << "zero_estimate " << what << " segment " << s << "\n" << out;
      EXPECT_EQ(v[2], e == 4 ? 0 : 4 * Ps / c.D) << "zero_estimate " << what << " segment " << s;
    }
  }
}

// ---- checkpoints ----

namespace {
std::string ckpt_step(const std::string& dir, int step) {
  char name[32];
  snprintf(name, sizeof name, "/step-%08d", step);
  return dir + name;
}
std::vector<double> losses_after(const Json& report, int step) {  // the losses of steps > step (1-based)
  std::vector<double> out;
  for (const Json& x : report["steps_log"].arr)
    if (int(x["step"].d()) > step) out.push_back(x["loss"].d());
  return out;
}
uint64_t bytes_of(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}
}  // namespace

// A pipeline checkpoint holds each rank's segment's units whole (and its optimizer state: --zero 1 its
// slice). Stop at step 2 of 4, resume: the same losses and model file as the run that never stopped.
// Resharding, as between the stages: stage0_ddp and stage1 on D ranks go on from a pipeline's
// checkpoint, a pipeline from stage1's, each to the model of the uninterrupted run (the pipeline is
// stage0_ddp --accum K bit for bit, stage1 too); consolidate merges a pipeline checkpoint into that
// model file byte for byte; each shard is the header plus what the ledger says its rank holds.
TEST(Pipeline, CheckpointsResumeBitForBitAndReshardToAndFromTheStages) {
  const std::string flags = kTiny + "--steps 4 --warmup 2 --accum 2 ", pipe = pipeline_flags(2, "1f1b", 2);
  const std::string dir = temp_dir() + "/pipe_ckpt", every2 = " --ckpt-every 2 --ckpt-dir ";
  RunResult full = run_trainer("pipeline", 4, flags + pipe + every2 + dir, "ck_full");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::string from = " --resume " + ckpt_step(dir, 2);
  struct Resume {
    const char* trainer;
    int np;
    std::string extra;
  };
  for (const Resume& x : {Resume{"pipeline", 4, pipe}, Resume{"pipeline", 4, pipe + "--zero 1 "},
                          Resume{"stage0_ddp", 2, ""}, Resume{"stage1", 2, ""}}) {
    RunResult r = run_trainer(x.trainer, x.np, flags + x.extra + from, "ck_resumed");
    ASSERT_EQ(r.exit_code, 0) << x.trainer << " " << x.extra << ": " << r.output;
    EXPECT_TRUE(same_model_bits(full.model_path, r.model_path)) << x.trainer << " " << x.extra;
    EXPECT_EQ(losses_after(full.report, 2), losses_after(r.report, 2)) << x.trainer << " " << x.extra;
    EXPECT_EQ(losses_after(r.report, 0).size(), 2u) << "it went on from step 2: " << x.trainer;
  }
  std::string out;
  const std::string merged = temp_dir() + "/pipe_merged.model";
  ASSERT_EQ(run_command(bin_dir() + "/consolidate --ckpt " + dir + " --out " + merged, &out), 0) << out;
  EXPECT_TRUE(same_model_bits(full.model_path, merged)) << out;

  // the reverse: stage1's checkpoint, resumed by the pipeline
  const std::string z1_dir = temp_dir() + "/z1_ckpt";
  RunResult z1 = run_trainer("stage1", 2, flags + every2 + z1_dir, "ck_z1");
  ASSERT_EQ(z1.exit_code, 0) << z1.output;
  EXPECT_TRUE(same_model_bits(full.model_path, z1.model_path));
  RunResult from_z1 = run_trainer("pipeline", 4, flags + pipe + " --resume " + ckpt_step(z1_dir, 2), "ck_from_z1");
  ASSERT_EQ(from_z1.exit_code, 0) << from_z1.output;
  EXPECT_TRUE(same_model_bits(full.model_path, from_z1.model_path));
  EXPECT_EQ(losses_after(full.report, 2), losses_after(from_z1.report, 2));

  // bf16 with --zero 1 (a master copy; each replica its own slice): resume, and the shard bytes
  const std::string bf = flags + "--precision bf16 " + pipe + "--zero 1 ", bf_dir = temp_dir() + "/pipe_ckpt_bf16";
  RunResult bf_full = run_trainer("pipeline", 4, bf + every2 + bf_dir, "ck_bf16");
  ASSERT_EQ(bf_full.exit_code, 0) << bf_full.output;
  RunResult bf_resumed = run_trainer("pipeline", 4, bf + " --resume " + ckpt_step(bf_dir, 2), "ck_bf16_resumed");
  ASSERT_EQ(bf_resumed.exit_code, 0) << bf_resumed.output;
  EXPECT_TRUE(same_model_bits(bf_full.model_path, bf_resumed.model_path));
  EXPECT_EQ(losses_after(bf_full.report, 2), losses_after(bf_resumed.report, 2));
  const uint64_t header = 8 + 6 * 4 + 32 * bf_full.report["units"].size();
  for (const Json& rank : bf_full.report["ranks"].arr) {
    uint64_t held = 0;
    for (const char* cat : {"params", "master", "adam_m", "adam_v"}) held += rank["ledger"]["device"]["peak"][cat].u();
    const int rk = int(rank["rank"].u());
    const uint64_t tied = rk / 2 == 1 ? 2 * bf_full.report["config"]["vocab"].u() * bf_full.report["config"]["dim"].u() : 0;
    char name[32];
    snprintf(name, sizeof name, "/rank-%05d.shard", rk);
    // the last segment's copy of wte is not in its shard: the first segment's wte is the one checkpointed
    EXPECT_EQ(bytes_of(ckpt_step(bf_dir, 4) + name), header + held - tied) << "rank " << rk;
  }
}

// ---- DeepSpeed's pipeline section (--config) ----

namespace {
std::string write_config(const std::string& name, const std::string& text) {
  const std::string path = temp_dir() + "/" + name + ".json";
  std::ofstream(path) << text;
  return path;
}
}  // namespace

// Its keys become the pipeline's flags: the run is the one those flags make (stage0_ddp with
// --activation-checkpointing on D = 2 ranks, --accum 3, bit for bit) and its report says P = 2,
// ZeRO-1; each key that changes nothing here is one note line. A key not built here, ZeRO-2/3, or
// a pipeline config given to another binary is one line naming the key (or the binary), exit 2.
TEST(Pipeline, DeepSpeedsPipelineSectionBecomesThePipelinesFlags) {
  const std::string cfg = write_config("ds_pipeline", R"({
    "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
    "zero_optimization": {"stage": 1},
    "pipeline": {"stages": 2, "partition": "parameters", "activation_checkpoint_interval": 1, "seed_layers": false,
                 "pipe_partitioned": true, "grad_partitioned": true}})");
  const RunResult& ref = shared_run("stage0_ddp", 2, kTiny + "--precision fp32 --activation-checkpointing --accum 3 ");
  RunResult r = run_trainer("pipeline", 4, kTiny + "--lr-schedule cosine --config " + cfg, "ds_pipe");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(compare_runs(ref, r).identical()) << compare_runs(ref, r).str();
  EXPECT_EQ(r.report["pipeline"]["segments"].u(), 2u);
  EXPECT_EQ(r.report["pipeline"]["zero"].u(), 1u);
  EXPECT_TRUE(r.report["activation_checkpointing"].b);
  EXPECT_EQ(r.report["accum"].u(), 3u);
  for (const char* key : {"pipeline.partition: ", "pipeline.seed_layers: ", "pipeline.pipe_partitioned: ",
                          "pipeline.grad_partitioned: "}) {
    size_t n = 0;
    for (size_t at = r.output.find(key); at != std::string::npos; at = r.output.find(key, at + 1)) n++;
    EXPECT_EQ(n, 1u) << key << " noted once: " << r.output;
  }
  struct Bad {
    const char* trainer;
    std::string config, flags, says;
  };
  const Bad bad[] = {
      {"pipeline", R"({"zero_optimization": {"stage": 2}})", "--pipeline 1",
       "zero_optimization.stage: 2: ZeRO-2 shards the gradient"},
      {"pipeline", R"({"zero_optimization": {"stage": 3}})", "--pipeline 1", "zero_optimization.stage: 3: ZeRO-3"},
      {"pipeline", R"({"pipeline": {"partition": "uniform"}})", "", "pipeline.partition: \"uniform\" is not built"},
      {"pipeline", R"({"pipeline": {"activation_checkpoint_interval": 2}})", "",
       "pipeline.activation_checkpoint_interval: 2: here a checkpoint is every block's input"},
      {"pipeline", R"({"pipeline": {"stages": "auto"}})", "", "add --pipeline P"},
      {"pipeline", R"({"pipeline": {"pipe_schedule": "interleaved"}})", "", "pipeline.pipe_schedule: unknown"},
      {"stage0_ddp", R"({"pipeline": {"stages": 2}})", "", "run build/bin/pipeline with it"},
  };
  int i = 0;
  for (const Bad& b : bad) {
    std::string out;
    const std::string path = write_config("ds_bad_" + std::to_string(i++), b.config);
    const int rc = run_command("timeout 60 " + bin_dir() + "/" + b.trainer + " " + kTiny + b.flags + " --config " + path,
                               &out);
    EXPECT_EQ(rc, 2) << b.config << ": " << out;
    EXPECT_NE(out.find(b.says), std::string::npos) << "want '" << b.says << "' in: " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}

// ---- the tests of the tests: each deliberately broken pipeline is caught ----
TEST(Pipeline, BrokenPipelinesAreCaught) {
  // P = 2, D = 2, K = 3: GPipe (the reversed backwards are GPipe's), two replicas (the wrong
  // neighbour is another replica's segment), K > 2 (a sum of two is the same in either order)
  const std::string flags = kTiny + "--precision fp32 " + pipeline_flags(2, "gpipe", 3);
  const RunResult& ref = shared_run("stage0_ddp", 2, kTiny + "--precision fp32 --accum 3 ");
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const RunResult& good = shared_run("pipeline", 4, flags);
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
