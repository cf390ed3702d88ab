// test_offload.cpp — offload (ZeRO-Offload) as a whole, under mpirun as a learner would run it:
// it trains the same bits as stage2 (its optimizer only moved to the host, or to disk), its ledger
// puts each byte where the design says, its host<->device traffic is the formula, and the disk
// tier leaves no file behind. (Bad --offload-dir values: tests/offload_check.sh.)
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "harness.h"

using namespace nzt;

namespace {

const std::string kTiny =
    "--preset tiny --seq 32 --batch 2 --steps 4 --lr 3e-3 --warmup 2 --eval-every 0 --eval-windows 4 ";

// What each rank owns (S), the largest unit (U), bytes per element (e), from the report.
struct ReportSizes {
  uint64_t P, S, U, N, e;
};
ReportSizes sizes_of(const Json& r) {
  uint64_t N = r["world"].u();
  return {r["padded_params"].u(), r["shard_params"].u(), r["max_unit_padded"].u(), N,
          r["precision"].str == "fp32" ? 4u : 2u};
}

}  // namespace

// fp32 on the CPU path: the same model file and the same step losses and norms as stage2, bit for
// bit, on 1..4 ranks (3 pads the units), with accumulation, with clipping active, in memory and on
// disk (chunks of 100 elements: the streaming cuts through tensors and units). And per step the
// link carries accum * S elements down and S up while the collectives are stage2's, and those are
// the formula's K(N-1)S + (N-1)S (reduce-scatter every micro-step, one all-gather).
TEST(Offload, TrainsTheSameBitsAsStage2) {
  for (int N : {1, 2, 3, 4}) {
    for (int accum : {1, 2, 3}) {
      const std::string flags = kTiny + "--clip 0.5 --accum " + std::to_string(accum);
      const std::string tag = "n" + std::to_string(N) + "a" + std::to_string(accum);
      const std::string dir = fresh_dir("disk_" + tag);
      RunResult s2 = run_trainer("stage2", N, flags, tag);
      RunResult cpu = run_trainer("offload", N, flags, tag);
      RunResult disk = run_trainer("offload", N, flags + " --offload-to disk --offload-chunk 100 --offload-dir " + dir, tag);
      ASSERT_EQ(s2.exit_code, 0) << s2.output;
      ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
      ASSERT_EQ(disk.exit_code, 0) << disk.output;
      SCOPED_TRACE("N=" + std::to_string(N) + " accum=" + std::to_string(accum));
      std::vector<double> norms = step_values(s2.report, "grad_norm");
      EXPECT_GT(*std::max_element(norms.begin(), norms.end()), 0.5) << "clipping never active";
      for (const RunResult* r : {&cpu, &disk}) {
        EXPECT_TRUE(same_model_bits(s2.model_path, r->model_path));
        EXPECT_EQ(max_abs_diff(step_values(s2.report, "loss"), step_values(r->report, "loss")), 0.0);
        EXPECT_EQ(max_abs_diff(norms, step_values(r->report, "grad_norm")), 0.0);
        const ReportSizes z = sizes_of(r->report);
        EXPECT_EQ(r->report["formula"]["link_elems_per_step"].u(), accum * z.S + z.S);
        for (size_t i = 0; i < r->report["steps_log"].size(); i++) {
          const Json& s = r->report["steps_log"][i];
          EXPECT_EQ(s["to_host_elems"].u(), accum * z.S);  // my reduced slice, every micro-step
          EXPECT_EQ(s["to_device_elems"].u(), z.S);        // my updated slice, once
          EXPECT_EQ(s["comm_elems"].u(), s2.report["steps_log"][i]["comm_elems"].u());
          EXPECT_EQ(s["comm_elems"].u(), (accum + 1) * (z.N - 1) * z.S);
        }
      }
      EXPECT_TRUE(files_in(dir).empty()) << "the disk tier left files in " << dir;
    }
  }
}

// bf16 on the CPU path: the host's fp32 master and the rounding to bf16 happen as on the device,
// so here too the bits are stage2's.
TEST(Offload, Bf16TrainsTheSameBitsAsStage2) {
  const std::string flags = kTiny + "--clip 0.5 --accum 2 --precision bf16";
  RunResult s2 = run_trainer("stage2", 3, flags, "bf16");
  RunResult cpu = run_trainer("offload", 3, flags, "bf16");
  RunResult disk = run_trainer("offload", 3, flags + " --offload-to disk --offload-chunk 77 --offload-dir " +
                                              fresh_dir("disk_bf16"), "bf16");
  ASSERT_EQ(s2.exit_code, 0) << s2.output;
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(disk.exit_code, 0) << disk.output;
  EXPECT_TRUE(same_model_bits(s2.model_path, cpu.model_path));
  EXPECT_TRUE(same_model_bits(s2.model_path, disk.model_path));
  EXPECT_EQ(max_abs_diff(step_values(s2.report, "loss"), step_values(cpu.report, "loss")), 0.0);
}

// fp16 likewise, at DeepSpeed's initial scale 2^16: the tiny model's first steps overflow, and
// offload must skip the same steps as stage2 (its host state untouched, on the host or on disk).
TEST(Offload, Fp16TrainsTheSameBitsAsStage2) {
  const std::string flags = kTiny + "--clip 0.5 --accum 2 --steps 6 --precision fp16";
  RunResult s2 = run_trainer("stage2", 3, flags, "fp16");
  RunResult cpu = run_trainer("offload", 3, flags, "fp16");
  RunResult disk = run_trainer("offload", 3, flags + " --offload-to disk --offload-chunk 77 --offload-dir " +
                                              fresh_dir("disk_fp16"), "fp16");
  ASSERT_EQ(s2.exit_code, 0) << s2.output;
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(disk.exit_code, 0) << disk.output;
  EXPECT_GE(skipped_steps(s2.report), 1) << "the run must exercise a skipped step";
  EXPECT_EQ(skipped_steps(cpu.report), skipped_steps(s2.report));
  EXPECT_TRUE(same_model_bits(s2.model_path, cpu.model_path));
  EXPECT_TRUE(same_model_bits(s2.model_path, disk.model_path));
  EXPECT_EQ(max_abs_diff(step_values(s2.report, "loss"), step_values(cpu.report, "loss")), 0.0);
}

// Where every byte lives, per rank (P padded parameters, S = P/N owned, U the largest unit, e bytes
// per element):
//   device: params eP + the gradient bucket eU; no gradients, master or Adam state at all;
//   host:   my gradient slices eS + fp32 master 4S + Adam m 4S + v 4S, and as scratch the slice
//           where one unit's reduced gradient lands, e U/N;
//   disk tier: master, m, v (4S each) on disk instead, and on the host only three chunk buffers
//   of 4 bytes x chunk (chunk = min(--offload-chunk, the largest slice U/N)), scratch too.
// Link bytes per step: e (accum S + S).
TEST(Offload, LedgerPutsTheOptimizerOnTheHostOrDisk) {
  const uint64_t chunk = 64;
  for (const char* prec : {"fp32", "bf16"}) {
    const std::string flags = kTiny + "--steps 2 --accum 2 --precision " + prec;
    RunResult cpu = run_trainer("offload", 3, flags, prec);
    RunResult disk = run_trainer("offload", 3, flags + " --offload-to disk --offload-chunk " + std::to_string(chunk) +
                                                   " --offload-dir " + fresh_dir(std::string("ledger_") + prec),
                                 prec);
    ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
    ASSERT_EQ(disk.exit_code, 0) << disk.output;
    for (const RunResult* r : {&cpu, &disk}) {
      const bool on_disk = r == &disk;
      const ReportSizes z = sizes_of(r->report);
      SCOPED_TRACE(std::string(prec) + (on_disk ? " disk" : " cpu"));
      ASSERT_LT(chunk, z.U / z.N) << "the chunk must be smaller than a slice for this test to bite";
      ASSERT_EQ(r->report["ranks"].size(), size_t(z.N));
      for (const Json& rank : r->report["ranks"].arr) {
        const Json& dev = rank["ledger"]["device"]["peak"];
        const Json& host = rank["ledger"]["host"]["peak"];
        const Json& dsk = rank["ledger"]["disk"]["peak"];
        EXPECT_EQ(dev["params"].u(), z.e * z.P);
        EXPECT_EQ(dev["comm_buffers"].u(), z.e * z.U);
        for (const char* c : {"grads", "master", "adam_m", "adam_v"}) EXPECT_EQ(dev[c].u(), 0u) << c;
        EXPECT_EQ(dev["total"].u(), z.e * z.P + z.e * z.U + dev["activations"].u());
        EXPECT_EQ(host["grads"].u(), z.e * z.S);
        EXPECT_EQ(host["comm_buffers"].u(), 0u);
        const uint64_t optimizer = 4 * z.S;  // each of master, m, v
        for (const char* c : {"master", "adam_m", "adam_v"}) {
          EXPECT_EQ(host[c].u(), on_disk ? 0 : optimizer) << c;
          EXPECT_EQ(dsk[c].u(), on_disk ? optimizer : 0) << c;
        }
        const uint64_t chunk_buffers = on_disk ? 3 * 4 * chunk : 0;
        EXPECT_EQ(host["scratch"].u(), z.e * (z.U / z.N) + chunk_buffers);
        EXPECT_EQ(host["total"].u(), z.e * z.S + z.e * (z.U / z.N) + (on_disk ? chunk_buffers : 3 * optimizer));
        EXPECT_EQ(dsk["total"].u(), on_disk ? 3 * optimizer : 0);
      }
      for (const Json& s : r->report["steps_log"].arr) {
        EXPECT_EQ(s["to_host_elems"].u(), 2 * z.S);
        EXPECT_EQ(s["to_device_elems"].u(), z.S);
      }
      // the bytes over the link, from the per-rank totals (setup copies the initial slice down once)
      const Json& link = r->report["ranks"][0]["comm"];
      EXPECT_EQ(link["to_host_bytes"].u(), z.e * (2 * 2 * z.S + z.S));
      EXPECT_EQ(link["to_device_bytes"].u(), z.e * 2 * z.S);
      EXPECT_NE(r->output.find("ledger matches the formulas on every rank"), std::string::npos) << r->output;
    }
  }
}
