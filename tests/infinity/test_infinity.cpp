// test_infinity.cpp — infinity (ZeRO-Infinity: stage3 with the parameter slices off the device)
// as a whole, under mpirun as a learner would run it:
//   - it trains stage3's bits: every step's loss and grad norm and the model file, on 1..4 ranks,
//     accum 1 and 3, fp32, bf16 and fp16, with the slices in host memory and on disk;
//   - its ledger holds on the device only the gathered units (the derived two-neighbour peak), the
//     gradient bucket and the activations; host and disk hold the rest, each the formula written
//     out below (and zero_formulas.h's, which the report carries, equals it);
//   - per step my slice of every gathered unit goes up (2KS elements) and my reduced gradient
//     slice comes down (KS), while the collectives are stage3's;
//   - the disk tier leaves no file behind;
//   - the deliberately broken copies of tests/infinity/mutants.mk are caught.
// A cheap matrix: each launched run is checked for everything above that applies to it, and the
// stage3 reference runs are shared (run_cached).
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

using namespace nzt;

namespace {

const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --steps 3 --lr 3e-3 --warmup 1 --clip 0.5 --eval-every 0 --eval-windows 2 ";

// One point of the matrix: ranks, accumulation, precision.
struct Case {
  int N, K;
  const char* prec;
};
std::string flags_of(const Case& c) {
  // fp16 at DeepSpeed's initial scale 2^16: the tiny model's first steps overflow, so infinity must
  // skip the same steps as stage3 (its host and disk state untouched)
  return kTiny + "--accum " + std::to_string(c.K) + " --precision " + c.prec;
}
std::string name_of(const Case& c) {
  return "N" + std::to_string(c.N) + "K" + std::to_string(c.K) + c.prec;
}

// The tier's extra flags: the disk tier with a small optimizer chunk (the streaming cuts through
// tensors and units), in a fresh directory that must be empty again after the run.
const uint64_t kChunk = 50;
std::string tier_flags(bool disk, const std::string& dir) {
  return disk ? " --offload-param disk --offload-chunk " + std::to_string(kChunk) + " --offload-dir " + dir : "";
}

// ---- the formulas, written out here, independently of zero_formulas.cpp ----
// Sizes from the report's unit list (harness.h: each unit padded to a multiple of N): P, S = P/N,
// U the largest unit, e bytes per element; the slices of unit u are padded[u]/N.
//   device:  params, grads, master, m, v: 0 (nothing of the model state but what is gathered);
//            comm_buffers: the gradient bucket eU;
//            gathered: at most two neighbours of the cycle embed, block 1..L, lnf (prefetch: the
//            next unit is gathered while this one computes), e max(p_u + p_{u+1 mod units});
//            one unit, eU, without prefetch;
//   host:    grads eS (summed there every micro-step), and as scratch the landing of one unit's
//            reduced slice, eU/N;
//            host tier: params eS, master 4S (in fp32 too: the host updates an fp32 copy and
//            writes the parameter slice back), m 4S, v 4S;
//            disk tier: instead the three optimizer chunks, 3 x 4 min(chunk, U/N), and the two
//            slots a slice is read into (one fetched, one read ahead), 2 e U/N: scratch;
//   disk:    disk tier: params eS, master 4S, m 4S, v 4S.
struct Expect {
  uint64_t e, P, S, U, N, gathered, gathered_bound;  // the peak of this run; with prefetch
};
Expect expect_of(const RunResult& r, int N, bool prefetch = true) {
  const Sizes z = sizes_from_units(r.report, N);
  Expect x{r.report["precision"].str == "fp32" ? 4u : 2u, z.P, z.S, z.U, uint64_t(N), 0, 0};
  uint64_t pair = 0;
  for (int u = 0; u < z.units(); u++) pair = std::max(pair, z.padded[u] + z.padded[(u + 1) % z.units()]);
  x.gathered_bound = x.e * pair;
  x.gathered = prefetch ? x.gathered_bound : x.e * z.U;
  return x;
}

// Everything wrong with run r's ledger and traffic (none: it holds), K micro-steps per step.
std::vector<std::string> ledger_problems(const RunResult& r, int N, int K, bool disk, bool prefetch = true) {
  std::vector<std::string> p;
  const Expect x = expect_of(r, N, prefetch);
  auto want = [&](const char* where, const char* cat, uint64_t got, uint64_t expected, bool at_most = false) {
    if (at_most ? got > expected : got != expected)
      p.push_back(std::string(where) + " " + cat + ": " + std::to_string(got) + " bytes, expected " +
                  (at_most ? "at most " : "") + std::to_string(expected));
  };
  const uint64_t e = x.e, S = x.S, U = x.U, slice = U / x.N;
  if (r.report["ranks"].size() != size_t(N)) p.push_back("not one ledger per rank");
  for (const Json& rank : r.report["ranks"].arr) {
    const Json& dev = rank["ledger"]["device"]["peak"];
    const Json& host = rank["ledger"]["host"]["peak"];
    const Json& dsk = rank["ledger"]["disk"]["peak"];
    for (const char* c : {"params", "grads", "master", "adam_m", "adam_v", "scratch"}) want("device", c, dev[c].u(), 0);
    want("device", "comm_buffers", dev["comm_buffers"].u(), e * U);
    want("device", "gathered", dev["gathered"].u(), x.gathered);
    want("device", "total", dev["total"].u(), e * U + x.gathered + dev["activations"].u(), true);
    want("host", "grads", host["grads"].u(), e * S);
    want("host", "gathered", host["gathered"].u(), 0);
    const uint64_t slots = disk ? 3 * 4 * std::min(kChunk, slice) + 2 * e * slice : 0;
    want("host", "scratch", host["scratch"].u(), e * slice + slots);
    want("host", "params", host["params"].u(), disk ? 0 : e * S);
    want("disk", "params", dsk["params"].u(), disk ? e * S : 0);
    for (const char* c : {"master", "adam_m", "adam_v"}) {
      want("host", c, host[c].u(), disk ? 0 : 4 * S);
      want("disk", c, dsk[c].u(), disk ? 4 * S : 0);
    }
    want("host", "total", host["total"].u(), e * S + e * slice + (disk ? slots : e * S + 12 * S));
    want("disk", "total", dsk["total"].u(), disk ? e * S + 12 * S : 0);
  }
  // zero_formulas.h's numbers, as the report carries them, are these
  const Json& f = r.report["formula"];
  want("formula", "params", f["params"].u(), e * S);
  want("formula", "master", f["master"].u(), 4 * S);
  want("formula", "gathered", f["gathered"].u(), x.gathered_bound);
  want("formula", "host", f["host"].u(), 2 * e * S + 12 * S);
  want("formula", "disk", f["disk"].u(), disk ? e * S + 12 * S : 0);
  // per step: up, my slice before each of the 2 units x ... gathers (forward: every unit and the
  // embedding again; backward: every unit but the embedding): 2S per micro-step; down, my reduced
  // gradient slice of every unit: S per micro-step
  if (f["link_elems_per_step"].u() != 3 * K * S) p.push_back("formula: link elements per step not 3KS");
  for (const Json& s : r.report["steps_log"].arr) {
    if (s["to_device_elems"].u() != 2 * K * S)
      p.push_back("step " + std::to_string(s["step"].u()) + ": " + std::to_string(s["to_device_elems"].u()) +
                  " elements up, expected 2KS = " + std::to_string(2 * K * S));
    if (s["to_host_elems"].u() != K * S)
      p.push_back("step " + std::to_string(s["step"].u()) + ": " + std::to_string(s["to_host_elems"].u()) +
                  " elements down, expected KS = " + std::to_string(K * S));
  }
  return p;
}

// Everything that differs between run r and its stage3 reference.
std::vector<std::string> equality_problems(const RunResult& s3, const RunResult& r) {
  std::vector<std::string> p;
  if (!same_model_bits(s3.model_path, r.model_path)) p.push_back("the model file differs from stage3's");
  const double dl = max_abs_diff(step_values(s3.report, "loss"), step_values(r.report, "loss"));
  const double dn = max_abs_diff(step_values(s3.report, "grad_norm"), step_values(r.report, "grad_norm"));
  if (dl != 0) p.push_back("step losses differ from stage3's by up to " + std::to_string(dl));
  if (dn != 0) p.push_back("grad norms differ from stage3's by up to " + std::to_string(dn));
  for (size_t i = 0; i < r.report["steps_log"].size() && i < s3.report["steps_log"].size(); i++)
    if (r.report["steps_log"][i]["comm_elems"].u() != s3.report["steps_log"][i]["comm_elems"].u())
      p.push_back("step " + std::to_string(i + 1) + ": collectives other than stage3's");
  return p;
}

// The disk tier's line at the end of the run: "... H of F fetches read ahead ...", as {H, F}.
std::pair<int, int> read_ahead_hits(const RunResult& r) {
  const size_t at = r.output.find(" fetches read ahead");
  if (at == std::string::npos) return {-1, -1};
  const size_t line = r.output.rfind(';', at);
  int hits = -1, fetches = -1;
  sscanf(r.output.c_str() + line + 1, " %d of %d", &hits, &fetches);
  return {hits, fetches};
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += "\n  " + x;
  return s;
}

}  // namespace

// The matrix: each rank count 1..4 (3 pads the units), accum 1 and 3, each precision, each tier;
// every infinity run against its stage3 run, bit for bit, and its ledger and traffic checked.
TEST(Infinity, TrainsStage3sBitsWithTheLedgerAndTrafficOfTheFormulas) {
  for (Case c : {Case{1, 1, "fp32"}, Case{2, 3, "bf16"}, Case{3, 1, "fp16"}, Case{4, 3, "fp32"}}) {
    const std::string flags = flags_of(c);
    SCOPED_TRACE(name_of(c));
    const RunResult& s3 = run_cached("stage3", c.N, flags);
    ASSERT_EQ(s3.exit_code, 0) << s3.output;
    std::vector<double> norms = step_values(s3.report, "grad_norm");
    if (std::string(c.prec) == "fp16") EXPECT_GE(skipped_steps(s3.report), 1) << "fp16 must skip a step here";
    else EXPECT_GT(*std::max_element(norms.begin(), norms.end()), 0.5) << "clipping never active";
    for (bool disk : {false, true}) {
      const std::string dir = fresh_dir("disk_" + name_of(c));
      const RunResult& r = run_cached("infinity", c.N, flags + tier_flags(disk, dir));
      SCOPED_TRACE(disk ? "disk" : "cpu");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      if (std::string(c.prec) == "fp16") {
        EXPECT_EQ(skipped_steps(r.report), skipped_steps(s3.report));
      }
      const auto eq = equality_problems(s3, r), led = ledger_problems(r, c.N, c.K, disk);
      EXPECT_TRUE(eq.empty()) << join(eq);
      EXPECT_TRUE(led.empty()) << join(led);
      EXPECT_NE(r.output.find("ledger matches the formulas on every rank"), std::string::npos) << r.output;
      EXPECT_TRUE(files_in(dir).empty()) << "the disk tier left files in " << dir;
      if (disk) {  // the read-ahead learns the order in the first micro-step, then guesses right
        const auto [hits, fetches] = read_ahead_hits(r);
        EXPECT_GT(fetches, 0) << r.output;
        EXPECT_GE(3 * hits, fetches) << "read ahead: " << hits << " of " << fetches;
      }
    }
  }
}

// --prefetch 0 on the disk tier: no gather ahead and no read ahead; the same bits, one unit
// gathered at a time. (With prefetch on, the matrix above requires the read-ahead to serve at least
// a third of the fetches: it guesses wrong only while it learns the order, and in validation.)
TEST(Infinity, DiskTierWithoutPrefetchTrainsTheSameBits) {
  const Case c{2, 3, "bf16"};
  const RunResult& s3 = run_cached("stage3", c.N, flags_of(c));
  const std::string dir = fresh_dir("disk_noprefetch");
  const RunResult& r = run_cached("infinity", c.N, flags_of(c) + tier_flags(true, dir) + " --prefetch 0");
  ASSERT_EQ(s3.exit_code, 0) << s3.output;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto eq = equality_problems(s3, r), led = ledger_problems(r, c.N, c.K, true, false);
  EXPECT_TRUE(eq.empty()) << join(eq);
  EXPECT_TRUE(led.empty()) << join(led);
  EXPECT_TRUE(files_in(dir).empty()) << "the disk tier left files in " << dir;
  EXPECT_EQ(read_ahead_hits(r).first, 0) << r.output;
}

// The tests of the tests: each broken copy (tests/infinity/mutants.mk) still runs, and the checks
// above must report it: the contract (stage3's bits) or the ledger and traffic. Three layers, so
// that a prefetch two units ahead in the backward makes three units alive at once.
TEST(Infinity, BrokenVariantsAreCaught) {
  const Case c{2, 1, "fp32"};
  const std::string flags = flags_of(c) + " --layers 3";
  const RunResult& s3 = run_cached("stage3", c.N, flags);
  ASSERT_EQ(s3.exit_code, 0) << s3.output;
  struct Mutant {
    const char* name;
    bool disk, equal, ledger;  // its tier; which checks must report it (the others must not)
  };
  for (Mutant m : {Mutant{"stale_slice", true, true, false}, Mutant{"prefetch_wrong_unit", true, false, true},
                   Mutant{"grad_slice_not_down", false, true, true}}) {
    const std::string mutant = std::string("mutant_infinity_") + m.name;
    SCOPED_TRACE(mutant);
    const std::string dir = fresh_dir(std::string("mutant_") + m.name);
    const RunResult r = run_trainer(mutant, c.N, flags + tier_flags(m.disk, dir), m.name);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto eq = equality_problems(s3, r), led = ledger_problems(r, c.N, c.K, m.disk);
    printf("mutant_infinity_%s: contract %s, ledger %s\n", m.name,
           eq.empty() ? "passes" : ("FAILS: " + eq[0]).c_str(), led.empty() ? "passes" : ("FAILS: " + led[0]).c_str());
    EXPECT_EQ(eq.empty(), !m.equal) << "contract check:" << join(eq);
    EXPECT_EQ(led.empty(), !m.ledger) << "ledger check:" << join(led);
  }
}

// Checkpoints (docs/checkpoints.md) hold what each rank holds, wherever it lives: infinity's
// slices come from host memory or the file. Against independent truth:
//   - resume: stopped at step 2 and resumed, the same model file and later losses as the
//     uninterrupted run, on each tier;
//   - from stage3: infinity resumed from stage3's checkpoint ends with stage3's model;
//   - to other stages and world sizes: infinity's 2-rank checkpoint resumed on 3 ranks by stage3,
//     by stage1 and by infinity gives one model, bit for bit (accum 1: every stage the same numbers).
TEST(Infinity, CheckpointsResumeBitForBitAndReshardToAndFromOtherStages) {
  const std::string flags = kTiny + "--steps 4 --precision bf16";
  auto ckpt = [](const std::string& name) { return " --ckpt-every 2 --ckpt-dir " + temp_dir() + "/" + name; };
  auto at_step2 = [](const std::string& name) { return " --resume " + temp_dir() + "/" + name + "/step-00000002"; };
  auto later_losses = [](const RunResult& r) {
    std::vector<double> l = step_values(r.report, "loss");
    return std::vector<double>(l.end() - 2, l.end());
  };
  const std::string disk = tier_flags(true, fresh_dir("ckpt_disk"));
  const RunResult& a = run_cached("infinity", 2, flags + disk + ckpt("inf2"));
  const RunResult& s = run_cached("stage3", 2, flags + ckpt("z3_2"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_TRUE(equality_problems(s, a).empty()) << join(equality_problems(s, a));
  for (const std::string& tier : {disk, std::string()}) {  // resume, each tier
    SCOPED_TRACE(tier.empty() ? "cpu" : "disk");
    const RunResult& r = run_cached("infinity", 2, flags + tier + at_step2("inf2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(same_model_bits(a.model_path, r.model_path));
    EXPECT_EQ(later_losses(a), step_values(r.report, "loss"));
  }
  {  // from stage3
    const RunResult& r = run_cached("infinity", 2, flags + at_step2("z3_2"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(same_model_bits(s.model_path, r.model_path));
    EXPECT_EQ(later_losses(s), step_values(r.report, "loss"));
  }
  // to stage3, stage1 and infinity on 3 ranks
  const RunResult& z3 = run_cached("stage3", 3, flags + at_step2("inf2"));
  const RunResult& z1 = run_cached("stage1", 3, flags + at_step2("inf2"));
  const RunResult& inf3 = run_cached("infinity", 3, flags + disk + at_step2("inf2"));
  for (const RunResult* r : {&z3, &z1, &inf3}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_TRUE(compare_runs(z3, z1).identical()) << compare_runs(z3, z1).str();
  EXPECT_TRUE(compare_runs(z3, inf3).identical()) << compare_runs(z3, inf3).str();
  EXPECT_FALSE(same_model_bits(a.model_path, z3.model_path)) << "the 3-rank runs must continue on 3 ranks";
}

// DeepSpeed's zero_optimization.offload_param (device cpu or nvme, nvme_path) selects infinity's
// flags: the shipped configs/infinity.json runs on the host tier, an nvme one on the disk tier in
// its nvme_path; every other binary, another stage or a second device is refused in one line.
TEST(Infinity, DeepSpeedOffloadParamSelectsInfinitysFlags) {
  const std::string run = "--preset tiny --seq 32 --steps 2 --eval-every 0 --eval-windows 2 ";
  const RunResult& cpu = run_cached("infinity", 2, run + "--config configs/infinity.json");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  EXPECT_EQ(cpu.report["settings"]["offload_param"].str, "cpu");
  EXPECT_EQ(cpu.report["precision"].str, "bf16");
  const std::string dir = fresh_dir("nvme");
  auto config = [](const std::string& name, const std::string& zero) {
    const std::string path = temp_dir() + "/" + name + ".json";
    FILE* f = fopen(path.c_str(), "w");
    fprintf(f, "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": %s}\n", zero.c_str());
    fclose(f);
    return path;
  };
  const std::string nvme = config("nvme", R"({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" + dir +
                                              R"(", "pin_memory": true}, "offload_optimizer": {"device": "nvme"}})");
  const RunResult& disk = run_cached("infinity", 2, run + "--config " + nvme);
  ASSERT_EQ(disk.exit_code, 0) << disk.output;
  EXPECT_EQ(disk.report["settings"]["offload_param"].str, "disk");
  EXPECT_EQ(disk.report["settings"]["offload_dir"].str, dir);
  EXPECT_GT(disk.report["ranks"][0]["ledger"]["disk"]["peak"]["params"].u(), 0u);
  EXPECT_TRUE(files_in(dir).empty());
  struct Bad {
    const char* binary;
    std::string config;
    const char* want;
  };
  const std::string cpu_param = config("cpu_param", R"({"stage": 3, "offload_param": {"device": "cpu"}})");
  for (const Bad& b : {Bad{"stage3", cpu_param, "run build/bin/infinity with it"},
                       Bad{"offload", cpu_param, "run build/bin/infinity with it"},
                       Bad{"infinity", "configs/stage3.json", "run build/bin/stage3 with it"},
                       Bad{"infinity", config("z2", R"({"stage": 2, "offload_param": {"device": "cpu"}})"),
                           "expected stage 3"},
                       Bad{"infinity", config("two", R"({"stage": 3, "offload_param": {"device": "cpu"},
                           "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})"), "expected the same device"},
                       Bad{"infinity", config("nopath", R"({"stage": 3, "offload_param": {"device": "nvme"}})"),
                           "without nvme_path"}}) {
    SCOPED_TRACE(std::string(b.binary) + " " + b.config);
    std::string out;
    const int rc = run_command("timeout 60 " + bin_dir() + "/" + b.binary + " --config " + b.config + " " + run, &out);
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find(b.want), std::string::npos) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  }
}
