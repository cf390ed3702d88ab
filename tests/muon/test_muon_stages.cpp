// test_muon_stages.cpp — Muon (--optimizer muon, common/muon.h) in stage0_ddp..stage3, run under
// mpirun as a learner runs them. What must hold:
//   - the stages' contract (contract.h, harness.h) with Muon on every trainer: stage1, stage2 and
//     stage3 equal stage0_ddp with Muon bit for bit (every step's loss and grad norm, the model file)
//     at N = 1..4 and accum 1; at accum 3 (N = 4) stage1 still equals stage0_ddp, stage2 and
//     stage3 equal each other (they reduce every micro-step) and step 1's norm is within the derived
//     bound of stage0_ddp's; bf16 and fp16 at N = 2; the other two designs (--muon-shard gather-all,
//     whole-matrices) at N = 3 and 4. Newton–Schulz gets the same whole matrix everywhere.
//   - Muon changes the run (it is not AdamW under another name);
//   - each rank's ledger equals the formulas written out here: adam_m 4 bytes per owned element
//     (Muon's momentum or AdamW's m), adam_v 4 bytes per owned AdamW element only, the Newton–Schulz
//     work space (scratch) 4 (2 rows cols + 3 min(rows, cols)^2) for the largest matrix, 4C x C;
//   - the elements each rank sends per step, point to point and all-gathered, for each design;
//   - zero_estimate --optimizer muon and DeepSpeed's "Muon" config;
//   - broken copies of Muon (tests/muon/muon.mk) fail the contract, or the ledger (whole_momentum);
//   - bad flags: one line, exit 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "contract.h"
#include "harness.h"

using namespace nzt;
using namespace nzt::contract;

namespace {

const std::string kMuon = "--optimizer muon";

// design: "" (the default, owners) or a --muon-shard value, for stages 1-3
const RunResult& muon_run(const std::string& trainer, int N, int K, const std::string& prec = "fp32",
                          const std::string& design = "") {
  return run(trainer, N, K, prec, kMuon + (design.empty() ? "" : " --muon-shard " + design));
}

// The contract of harness.h for `trainer` with Muon, against stage0_ddp with Muon (and the peer with
// Muon, the same design).
std::vector<std::string> muon_contract(const std::string& trainer, int N, int K, const std::string& prec,
                                       std::string* summary, const std::string& design = "") {
  const bool cross = K > 1 && !sums_micro_steps_locally(trainer);
  const std::string peer = peer_of(trainer);
  return contract_problems(trainer, muon_run(trainer, N, K, prec, design), N, K, prec,
                           muon_run("stage0_ddp", N, K, prec), peer,
                           cross ? &muon_run(peer, N, K, prec, design) : nullptr,
                           cross ? &micro_norms(N, K, prec) : nullptr, summary);
}

void expect_contract(const std::string& trainer, int N, int K, const std::string& prec,
                     const std::string& design = "") {
  const RunResult& r = muon_run(trainer, N, K, prec, design);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(step_values(r.report, "loss").size(), size_t(steps_for(prec)));
  std::string summary;
  const std::vector<std::string> problems = muon_contract(trainer, N, K, prec, &summary, design);
  printf("muon%s%s %s %s N=%d accum=%d: %s\n", design.empty() ? "" : " --muon-shard ", design.c_str(),
         prec.c_str(), trainer.c_str(), N, K, summary.c_str());
  for (const std::string& p : problems) ADD_FAILURE() << trainer << " " << design << ": " << p;
}

// The Muon matrices of one block, written out in the layout's order (layout.h): name, elements,
// Muon or not. The embedding and lnf units hold no Muon matrix.
struct Piece { const char* name; uint64_t n; bool muon; };
std::vector<Piece> block_pieces(uint64_t C) {
  return {{"ln1_w", C, false},      {"ln1_b", C, false},        {"qkv_w", 3 * C * C, true}, {"qkv_b", 3 * C, false},
          {"attproj_w", C * C, true}, {"attproj_b", C, false}, {"ln2_w", C, false},        {"ln2_b", C, false},
          {"fc_w", 4 * C * C, true}, {"fc_b", 4 * C, false},     {"fcproj_w", 4 * C * C, true}, {"fcproj_b", C, false}};
}

// Per rank r: Muon elements in its slices, and elements it sends per step to the other owners.
struct RankMuon { uint64_t muon = 0, p2p = 0; };
std::vector<RankMuon> expected_per_rank(const Json& report, int N, uint64_t C, bool ddp) {
  std::vector<RankMuon> out(N);
  const Sizes z = sizes_from_units(report, N);
  for (int u = 1; u + 1 < z.units(); u++) {  // the blocks
    const uint64_t s = z.padded[u] / N;
    uint64_t at = 0;
    for (const Piece& p : block_pieces(C)) {
      if (p.muon) {
        int owners = 0;
        std::vector<uint64_t> part(N);
        for (int r = 0; r < N; r++) {
          const uint64_t lo = std::max(at, r * s), hi = std::min(at + p.n, (r + 1) * s);
          part[r] = hi > lo ? hi - lo : 0;
          owners += part[r] > 0;
        }
        for (int r = 0; r < N; r++) {
          out[r].muon += ddp ? p.n : part[r];
          if (!ddp && part[r] > 0) out[r].p2p += part[r] * (owners - 1);
        }
      }
      at += p.n;
    }
  }
  return out;
}

}  // namespace

// The headline: Muon's update needs whole matrices, and the sharded stages still compute stage0_ddp's
// numbers bit for bit.
// (Accum 3 at N = 4 only, for make test's budget: the accumulation is element-wise and checked at
// every N by the stages' own suites; N = 4 cuts two matrices a block, N = 3 pads the units and cuts
// attproj_w and fc_w instead, N = 1 cuts nothing.)
TEST(MuonStages, Fp32ContractForOneToFourRanks) {
  for (auto [N, K] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{3, 1}, std::pair{4, 1}, std::pair{4, 3}}) {
    for (const char* trainer : {"stage1", "stage2", "stage3"}) {
      SCOPED_TRACE(std::string(trainer) + " N=" + std::to_string(N) + " accum=" + std::to_string(K));
      expect_contract(trainer, N, K, "fp32");
    }
  }
}

// The other two designs (--muon-shard, muon_formulas.h) make the same whole X: the same bits too, at
// N = 3 and 4 (each cuts two matrices a block, in different places) and accum 1 and 3.
TEST(MuonStages, GatherAllAndWholeMatricesAreStage0Exactly) {
  struct Case { int N, K; std::vector<const char*> trainers; };
  const Case cases[] = {{3, 1, {"stage1", "stage2", "stage3"}}, {4, 1, {"stage1", "stage2", "stage3"}},
                        {4, 3, {"stage2", "stage3"}}};
  for (const char* design : {"gather-all", "whole-matrices"}) {
    for (const Case& c : cases) {
      for (const char* trainer : c.trainers) {
        SCOPED_TRACE(std::string(trainer) + " " + design + " N=" + std::to_string(c.N) + " accum=" +
                     std::to_string(c.K));
        expect_contract(trainer, c.N, c.K, "fp32", design);
      }
    }
  }
}

TEST(MuonStages, Bf16AndFp16ContractAtTwoRanks) {
  for (const char* prec : {"bf16", "fp16"}) {
    for (const char* trainer : {"stage1", "stage2", "stage3"}) {
      SCOPED_TRACE(std::string(trainer) + " " + prec);
      expect_contract(trainer, 2, 1, prec);
    }
  }
}

// Muon is not AdamW: the same run with --optimizer adamw ends in another model, with other losses.
TEST(MuonStages, MuonChangesTheRun) {
  const RunResult& m = muon_run("stage0_ddp", 2, 1);
  const RunResult& a = run("stage0_ddp", 2, 1);
  ASSERT_EQ(m.exit_code, 0) << m.output;
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const Verdict v = compare_runs(a, m);
  printf("stage0_ddp N=2, muon vs adamw: %s\n", v.str().c_str());
  EXPECT_FALSE(v.model_equal);
  EXPECT_FALSE(v.losses_equal);
  // the first step's loss is computed before any update: the same in both
  EXPECT_EQ(step_values(m.report, "loss")[0], step_values(a.report, "loss")[0]);
}

// Per rank, to the byte, in every stage; the formulas written out from the block's tensors (above).
TEST(MuonStages, LedgerMatchesTheFormulasOnEveryRank) {
  struct Case { int N; const char* prec; };
  for (Case c : {Case{4, "fp32"}, Case{3, "fp32"}, Case{2, "bf16"}}) {
    for (const char* stage : {"stage0_ddp", "stage1", "stage2", "stage3"}) {
      SCOPED_TRACE(std::string(stage) + " " + c.prec + " N=" + std::to_string(c.N));
      const RunResult& r = muon_run(stage, c.N, 1, c.prec);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("ledger matches the formulas on every rank"), std::string::npos) << r.output;
      const bool ddp = std::string(stage) == "stage0_ddp";
      const uint64_t C = r.report["config"]["dim"].u();
      ASSERT_GT(C, 0u);
      const Sizes z = sizes_from_units(r.report, c.N);
      const uint64_t owned = ddp ? z.P : z.S;  // elements with optimizer state on each rank
      const std::vector<RankMuon> want = expected_per_rank(r.report, c.N, C, ddp);
      const uint64_t work = 4 * (2 * 4 * C * C + 3 * C * C);  // fc_w (4C x C): X, X's next, 3 C x C
      ASSERT_EQ(r.report["ranks"].size(), size_t(c.N));
      uint64_t p2p_sum = 0;
      for (const Json& rank : r.report["ranks"].arr) {
        const int rk = int(rank["rank"].u());
        const Json& peak = rank["ledger"]["device"]["peak"];
        EXPECT_EQ(peak["adam_m"].u(), 4 * owned) << "rank " << rk;
        EXPECT_EQ(peak["adam_v"].u(), 4 * (owned - want[rk].muon)) << "rank " << rk;
        EXPECT_EQ(peak["master"].u(), std::string(c.prec) == "fp32" ? 0 : 4 * owned) << "rank " << rk;
        EXPECT_EQ(peak["scratch"].u(), work) << "rank " << rk;
        EXPECT_EQ(rank["comm"]["p2p"]["elems_sent"].u(), steps_for(c.prec) * want[rk].p2p) << "rank " << rk;
        EXPECT_EQ(r.report["muon"]["ranks"][rk]["p2p_elems_per_step"].u(), want[rk].p2p) << "rank " << rk;
        p2p_sum += want[rk].p2p;
        if (c.N == 4 && !ddp && std::string(c.prec) == "fp32")
          printf("%s N=4 rank %d: adam_m %llu adam_v %llu (AdamW: %llu) scratch %llu, p2p %llu elements/step\n",
                 stage, rk, (unsigned long long)peak["adam_m"].u(), (unsigned long long)peak["adam_v"].u(),
                 (unsigned long long)(4 * owned), (unsigned long long)peak["scratch"].u(),
                 (unsigned long long)want[rk].p2p);
      }
      if (!ddp && c.N > 1) {
        EXPECT_GT(p2p_sum, 0u) << "no matrix cut at N = " << c.N << ": the test sees nothing";
      }
    }
  }
}

// The designs' own bytes, per rank, written out here from the block's tensors: gather-all adds one
// all-gather of X per block, (N - 1) S_u elements, and holds the gathered block (4 U_block bytes of
// scratch more); whole-matrices sends each owner's part of X to the matrix's rank (k mod N, k counting
// the matrices in order) and its part of O back.
TEST(MuonStages, DesignsSendAndHoldWhatTheFormulasSay) {
  const int N = 4;
  for (const char* design : {"owners", "gather-all", "whole-matrices"}) {
    for (const char* stage : {"stage2", "stage3"}) {
      SCOPED_TRACE(std::string(stage) + " " + design);
      const RunResult& r = muon_run(stage, N, 1, "fp32", std::string(design) == "owners" ? "" : design);
      const RunResult& a = run(stage, N, 1);  // AdamW: the stage's own collectives
      ASSERT_EQ(r.exit_code, 0) << r.output;
      ASSERT_EQ(a.exit_code, 0) << a.output;
      const uint64_t C = r.report["config"]["dim"].u();
      const Sizes z = sizes_from_units(r.report, N);
      std::vector<uint64_t> p2p(N, 0), flops(N, 0);
      uint64_t gather = 0;
      int k = 0;
      for (int u = 1; u + 1 < z.units(); u++) {
        const uint64_t s = z.padded[u] / N;
        gather += (N - 1) * s;
        uint64_t at = 0;
        for (const Piece& p : block_pieces(C)) {
          if (p.muon) {
            std::vector<uint64_t> part(N);
            int owners = 0;
            for (int q = 0; q < N; q++) {
              const uint64_t lo = std::max(at, q * s), hi = std::min(at + p.n, (q + 1) * s);
              part[q] = hi > lo ? hi - lo : 0;
              owners += part[q] > 0;
            }
            const int assignee = k++ % N;
            for (int q = 0; q < N; q++) {
              if (std::string(design) == "owners" && part[q] > 0) p2p[q] += part[q] * (owners - 1);
              if (std::string(design) == "whole-matrices")
                p2p[q] += q == assignee ? p.n - part[q] : part[q];
            }
          }
          at += p.n;
        }
      }
      if (std::string(design) != "gather-all") gather = 0;
      const uint64_t work = 4 * (11 * C * C) + (std::string(design) == "gather-all" ? 4 * z.padded[1] : 0);
      for (const Json& rank : r.report["ranks"].arr) {
        const int rk = int(rank["rank"].u());
        EXPECT_EQ(rank["comm"]["p2p"]["elems_sent"].u(), kSteps * p2p[rk]) << "rank " << rk;
        EXPECT_EQ(rank["comm"]["all_gather"]["elems_sent"].u(),
                  a.report["ranks"][rk]["comm"]["all_gather"]["elems_sent"].u() + kSteps * gather) << "rank " << rk;
        EXPECT_EQ(rank["ledger"]["device"]["peak"]["scratch"].u(), work) << "rank " << rk;
        EXPECT_EQ(r.report["muon"]["ranks"][rk]["p2p_elems_per_step"].u(), p2p[rk]) << "rank " << rk;
      }
      EXPECT_EQ(r.report["muon"]["gather_elems_per_step"].u(), gather);
      if (std::string(stage) == "stage2") {
        std::string per_rank;
        for (int q = 0; q < N; q++)
          per_rank += (q ? ", " : "") + std::to_string(p2p[q]) + " p2p / " +
                      std::to_string(r.report["muon"]["ranks"][q]["ns_flops_per_step"].u() / 1000) + " kFLOP";
        printf("%s N=4: per rank per step %s; all-gather +%llu elements; scratch %llu bytes\n", design,
               per_rank.c_str(), (unsigned long long)gather, (unsigned long long)work);
      }
    }
  }
}

// The report's formula with Muon (--log-json): "formula" is rank 0's and "formula_ranks" every rank's,
// Muon's own: adam_m 4 bytes per owned element, adam_v 4 bytes per owned AdamW element only (both
// written out here from the block's tensors), the work space each design holds (scratch) and the
// elements each rank sends per step, the stage's collectives plus Muon's exchange. Each must be the
// ledger and the comm ledger of that rank, for every stage and design (the same runs as above).
TEST(MuonStages, ReportFormulaIsMuonsOnEveryRank) {
  const int N = 4;
  struct Case { const char* stage; std::string design; };
  for (const Case& c : {Case{"stage0_ddp", ""}, Case{"stage1", ""}, Case{"stage2", ""}, Case{"stage3", ""},
                        Case{"stage2", "gather-all"}, Case{"stage3", "whole-matrices"}}) {
    SCOPED_TRACE(std::string(c.stage) + " " + c.design);
    const RunResult& r = muon_run(c.stage, N, 1, "fp32", c.design);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const bool ddp = std::string(c.stage) == "stage0_ddp";
    const uint64_t C = r.report["config"]["dim"].u();
    const Sizes z = sizes_from_units(r.report, N);
    const uint64_t owned = ddp ? z.P : z.S;
    const std::vector<RankMuon> want = expected_per_rank(r.report, N, C, ddp);
    ASSERT_TRUE(r.report.has("formula_ranks")) << "the report has no per-rank formula for Muon";
    const Json& per_rank = r.report["formula_ranks"];
    ASSERT_EQ(per_rank.size(), size_t(N));
    for (const Json& rank : r.report["ranks"].arr) {
      const int rk = int(rank["rank"].u());
      const Json& f = per_rank[rk];
      const Json& peak = rank["ledger"]["device"]["peak"];
      EXPECT_EQ(f["adam_m"].u(), 4 * owned) << "rank " << rk;
      EXPECT_EQ(f["adam_v"].u(), 4 * (owned - want[rk].muon)) << "rank " << rk << ": Muon has no second moment";
      for (const char* cat : {"params", "grads", "master", "adam_m", "adam_v", "comm_buffers"})
        EXPECT_EQ(f[cat].u(), peak[cat].u() + rank["ledger"]["host"]["peak"][cat].u()) << "rank " << rk << " " << cat;
      EXPECT_LE(peak["gathered"].u(), f["gathered"].u()) << "rank " << rk;
      EXPECT_EQ(f["optimizer_work"].u(), peak["scratch"].u()) << "rank " << rk << ": Muon's work space";
      // Muon's own messages: its point-to-point (all of them but gather-all's all-gathers)
      const uint64_t gather = r.report["muon"]["gather_elems_per_step"].u();
      EXPECT_EQ(rank["comm"]["p2p"]["elems_sent"].u(), kSteps * (f["optimizer_comm_elems_per_step"].u() - gather))
          << "rank " << rk;
      if (c.design.empty()) {
        EXPECT_EQ(f["optimizer_comm_elems_per_step"].u(), want[rk].p2p) << "rank " << rk;
      }
    }
    // rank 0's steps, as its comm ledger counted them: the stage's collectives and Muon's exchange
    for (const Json& step : r.report["steps_log"].arr)
      EXPECT_EQ(step["comm_elems"].u(), r.report["formula"]["comm_elems_per_step"].u()) << "step " << step["step"].u();
    for (const char* key : {"adam_v", "optimizer_work", "comm_elems_per_step", "optimizer_comm_elems_per_step"})
      EXPECT_EQ(r.report["formula"][key].u(), per_rank[0][key].u()) << "formula is rank 0's: " << key;
    EXPECT_LT(r.report["formula"]["adam_v"].u(), 4 * owned) << "AdamW's adam_v in a Muon run's formula";
    if (!ddp) {
      EXPECT_GT(per_rank[N - 1]["optimizer_comm_elems_per_step"].u(), 0u) << "nothing cut at N = 4?";
    }
  }
  // AdamW's report keeps one formula for every rank
  const RunResult& a = run("stage2", N, 1);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_FALSE(a.report.has("formula_ranks"));
}

// The tests of the tests: stage2 with a broken Muon (tests/muon/muon.mk), at N = 4 where the slices
// cut fc_w and fcproj_w of every block, must fail to be stage0_ddp's with Muon.
TEST(MuonStages, BrokenMuonCopiesAreCaught) {
  for (const char* m : {"ns_on_slice", "update_twice", "embedding_to_muon"}) {
    const std::string mutant = std::string("mutant_muon_") + m;
    const RunResult& r = muon_run(mutant, 4, 1);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string summary;
    const std::vector<std::string> problems = muon_contract(mutant, 4, 1, "fp32", &summary);
    printf("%s: %s\n", mutant.c_str(), summary.c_str());
    EXPECT_FALSE(problems.empty()) << mutant << " passed the contract: it cannot see this bug";
  }
}

// The memory bug: whole_momentum keeps the momentum of the whole of every matrix a rank owns part of.
// It computes the same numbers (the contract cannot see it); the ledger against the formula does.
TEST(MuonStages, WholeMatrixMomentumIsCaughtByTheLedger) {
  const std::string mutant = "mutant_muon_whole_momentum";
  const RunResult& r = muon_run(mutant, 4, 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string summary;
  const bool same_numbers = muon_contract(mutant, 4, 1, "fp32", &summary).empty();
  EXPECT_NE(r.output.find("ledger DOES NOT MATCH the formulas"), std::string::npos) << r.output;
  const uint64_t S = sizes_from_units(r.report, 4).S;
  int over = 0;
  for (const Json& rank : r.report["ranks"].arr) over += rank["ledger"]["device"]["peak"]["adam_m"].u() != 4 * S;
  printf("%s: %s; adam_m above the formula's 4S on %d of 4 ranks\n", mutant.c_str(), summary.c_str(), over);
  EXPECT_TRUE(same_numbers) << "the mutant was meant to change memory only";
  EXPECT_EQ(over, 3) << "ranks 1, 2, 3 own parts of cut matrices at N = 4";
}

// Bad flags: one line, exit 2, before anything runs.
TEST(MuonStages, BadFlagsGetOneLine) {
  const std::string base = "--preset tiny --steps 1 --seq 32 --batch 2 --quiet ";
  struct Bad { const char* program; std::string flags, says; };
  const Bad cases[] = {
      {"stage1", "--optimizer sgd", "unknown optimizer"},
      {"stage2", "--muon-lr 0.01", "expected it with --optimizer muon"},
      {"stage0_ddp", "--adam-lr 0.01", "expected it with --optimizer muon"},
      {"stage3", "--optimizer muon --muon-lr 11", "a learning rate in [0, 10]"},
      {"stage1", "--optimizer muon --adam-lr -1", "a learning rate in [0, 10]"},
      {"offload", "--optimizer muon", "DeepSpeed does not offload Muon either"},
      {"infinity", "--optimizer muon", "DeepSpeed does not offload Muon either"},
      {"pipeline", "--optimizer muon", "stage0_ddp, stage1, stage2 and stage3 only"},
      {"stage2", "--optimizer muon --ckpt-dir " + temp_dir() + "/ck", "not in the checkpoints yet"},
      {"stage0_ddp", "--optimizer muon --muon-shard gather-all", "with stage0_ddp: every rank holds every matrix"},
      {"stage2", "--optimizer muon --muon-shard halves", "unknown design"},
      {"stage1", "--optimizer muon --batch auto --memory-budget 64MiB", "the fit counts AdamW's state"},
      {"stage3", "--muon-shard whole-matrices", "expected it with --optimizer muon"},
  };
  for (const Bad& b : cases) {
    std::string out;
    const int rc = run_command("timeout -k 5 60 mpirun -np 1 " + program_path(b.program) + " " + base + b.flags, &out);
    SCOPED_TRACE(std::string(b.program) + " " + b.flags + ": " + out);
    EXPECT_EQ(rc, 2);
    EXPECT_NE(out.find(b.says), std::string::npos);
    size_t lines = 0;
    for (char ch : out) lines += ch == '\n';
    EXPECT_EQ(lines, 1u);
  }
}

// zero_estimate --optimizer muon: the cut matrices it names are the ones the layout says (tiny, N = 4:
// fc_w on ranks 1..2 and fcproj_w on ranks 2..3 of each block, above), and its adam_v range for stage1
// is the measured ledger's, lowest and highest rank.
TEST(MuonStages, ZeroEstimateNamesTheCutsAndTheLedgersBytes) {
  std::string out;
  ASSERT_EQ(run_command(program_path("zero_estimate") + " --preset tiny --world 4 --optimizer muon", &out), 0) << out;
  EXPECT_NE(out.find("at N = 4 the slices cut 4 of them"), std::string::npos) << out;
  for (const char* cut : {"block0.fc_w          128 x 32    ranks 1..2", "block1.fcproj_w       32 x 128   ranks 2..3"})
    EXPECT_NE(out.find(cut), std::string::npos) << cut << "\n" << out;
  const RunResult& r = muon_run("stage1", 4, 1);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const Json& rank : r.report["ranks"].arr) {
    lo = std::min<uint64_t>(lo, rank["ledger"]["device"]["peak"]["adam_v"].u());
    hi = std::max<uint64_t>(hi, rank["ledger"]["device"]["peak"]["adam_v"].u());
  }
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  size_t at = out.find("\n  stage1 ");
  ASSERT_NE(at, std::string::npos) << out;
  const std::string row = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  printf("zero_estimate's stage1 row: %s (ledger: adam_v %s)\n", row.c_str(), range.c_str());
  EXPECT_NE(row.find(" " + range), std::string::npos) << row;
  // its --json (the explorer's Muon panel): the same cuts and the ledger's lowest and highest adam_v
  std::string js;
  ASSERT_EQ(run_command(program_path("zero_estimate") + " --preset tiny --world 4 --optimizer muon --json 2>/dev/null",
                        &js), 0) << js;
  const Json m = Json::parse(js)["muon"][0];
  EXPECT_EQ(m["world"].u(), 4u);
  EXPECT_EQ(m["cut"].size(), 4u);
  EXPECT_EQ(m["cut"][0]["name"].str, "block0.fc_w");
  EXPECT_EQ(m["stages"][1]["stage"].str, "stage1");
  EXPECT_EQ(m["stages"][1]["adam_v_muon_min"].u(), lo);
  EXPECT_EQ(m["stages"][1]["adam_v_muon_max"].u(), hi);
  EXPECT_EQ(m["stages"][1]["adam_v_adamw"].u(), m["stages"][1]["adam_m"].u());
}

// DeepSpeed's optimizer.type "Muon" (ds_config.cpp): its muon_lr and adam_lr become --muon-lr and
// --adam-lr (the report's "muon" object says which rates ran); a momentum other than this Muon's 0.95,
// or a Muon key beside type AdamW: one line, exit 2; Muon with offload_optimizer: refused by offload.
TEST(MuonStages, DeepSpeedConfigMuon) {
  const std::string dir = fresh_dir("ds_muon");
  auto write = [&](const std::string& name, const std::string& type, const std::string& extra_params,
                   const std::string& zero) {
    std::ofstream(dir + "/" + name) << "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"" << type
                                    << "\", \"params\": {\"lr\": 0.003, \"muon_lr\": 0.004, \"adam_lr\": 0.002"
                                    << extra_params << "}}, \"zero_optimization\": {\"stage\": 2" << zero << "}}";
    return dir + "/" + name;
  };
  const std::string base = "--preset tiny --seq 32 --steps 1 --eval-every 0 --eval-windows 4 --quiet ";
  const RunResult r = run_trainer("stage2", 2, base + "--config " + write("muon.json", "Muon", ", \"momentum\": 0.95", ""),
                                  "ds_muon");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_DOUBLE_EQ(r.report["muon"]["muon_lr"].d(), 0.004);
  EXPECT_DOUBLE_EQ(r.report["muon"]["adam_lr"].d(), 0.002);
  struct Bad { std::string program, config, says; };
  const Bad cases[] = {
      {"stage2", write("momentum.json", "Muon", ", \"momentum\": 0.9", ""), "momentum is fixed at 0.95"},
      {"stage2", write("adamw.json", "AdamW", "", ""), "a Muon key beside type"},
      {"offload", write("offload.json", "Muon", "", ", \"offload_optimizer\": {\"device\": \"cpu\"}"),
       "DeepSpeed does not offload Muon either"},
  };
  for (const Bad& b : cases) {
    std::string out;
    const int rc = run_command("timeout -k 5 60 mpirun -np 1 " + program_path(b.program) + " " + base + "--config " +
                               b.config, &out);
    SCOPED_TRACE(b.program + " " + b.config + ": " + out);
    EXPECT_EQ(rc, 2);
    EXPECT_NE(out.find(b.says), std::string::npos);
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1);
  }
}
